"""strip_wrapper_prefixes: the one rule for parameter names that wrappers changed (model_merger, the
hf rollout's weight loader and the vLLM weight sync all use it)."""

import pytest

from hybridflow.utils.param_names import strip_wrapper_prefixes


@pytest.mark.parametrize(
    "name, plain",
    [
        ("_orig_mod.model.norm.weight", "model.norm.weight"),  # torch.compile
        ("module._orig_mod.model.norm.weight", "model.norm.weight"),  # DDP around a compiled model
        ("module._fsdp_wrapped_module.lm_head.weight", "lm_head.weight"),  # FSDP1 inside DDP
        ("_checkpoint_wrapped_module.lm_head.weight", "lm_head.weight"),
        ("model.layers.0._fsdp_wrapped_module.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        ("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        ("model.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.mlp.w", "model.layers.0.mlp.w"),
        ("model.layers.0._orig_mod.mlp.w", "model.layers.0.mlp.w"),
        ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),  # already plain
        ("model.submodule.x", "model.submodule.x"),  # "module." inside a word is not a wrapper
    ],
)
def test_wrapper_parts_are_removed(name, plain):
    assert strip_wrapper_prefixes(name) == plain
    assert strip_wrapper_prefixes(name, peft=True) == plain


def test_peft_prefix_only_on_request():
    # adapter tensors keep peft's names (vLLM's adapter loader reads them); a plain module drops them
    name = "_orig_mod.module.base_model.model.model.layers.0.q_proj.lora_A.weight"
    assert strip_wrapper_prefixes(name) == "base_model.model.model.layers.0.q_proj.lora_A.weight"
    assert strip_wrapper_prefixes(name, peft=True) == "model.layers.0.q_proj.lora_A.weight"
    assert strip_wrapper_prefixes("_orig_mod.module.base_model.model.x.weight", peft=True) == "x.weight"
