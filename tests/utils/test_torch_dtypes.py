from hybridflow.utils.torch_dtypes import resolve_dtype


def test_auto_depends_on_the_device():
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("AUTO", "cuda") == "bfloat16"
    assert resolve_dtype("auto", "cuda:1") == "bfloat16"  # a device string with an index
    assert resolve_dtype(None, "cpu") == "float32" and resolve_dtype(None, "cuda") == "bfloat16"


def test_aliases_and_plain_names():
    assert [resolve_dtype(n, "cpu") for n in ("bf16", "fp16", "half", "fp32", "float")] == [
        "bfloat16",
        "float16",
        "float16",
        "float32",
        "float32",
    ]
    assert resolve_dtype("fp32", "cuda") == "float32"  # an explicit choice wins over the device
    assert resolve_dtype("BFloat16", "cpu") == "bfloat16"
