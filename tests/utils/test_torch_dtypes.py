from hybridflow.utils.torch_dtypes import cpu_has_fast_bf16, resolve_dtype


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


def test_fast_bf16_is_read_from_the_cpu_flags(tmp_path):
    def cpu(flags: str) -> str:
        path = tmp_path / "cpuinfo"
        path.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
        return str(path)

    assert cpu_has_fast_bf16(cpu("fpu avx2 avx512f amx_bf16 amx_tile"))
    assert cpu_has_fast_bf16(cpu("fpu avx512f avx512_bf16"))
    assert not cpu_has_fast_bf16(cpu("fpu avx2 avx512f amx_int8"))  # int8 tiles only
    assert not cpu_has_fast_bf16(str(tmp_path / "missing"))
