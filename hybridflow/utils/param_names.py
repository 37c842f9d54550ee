"""Parameter names as a plain Hugging Face model spells them, without the parts wrappers add."""

from __future__ import annotations

# prefixes that wrappers put in front of parameter names (torch.compile, DDP, FSDP1, activation
# checkpointing), possibly nested; and the same wrappers met inside a name (``layers.0._fsdp_wrapped_module.mlp``)
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")
INNER_WRAPPER_PARTS = ("._orig_mod.", "._fsdp_wrapped_module.", "._checkpoint_wrapped_module.")
PEFT_PREFIX = "base_model.model."  # a peft model's own prefix


def strip_wrapper_prefixes(name: str, peft: bool = False) -> str:
    """``module._orig_mod.model.layers.0._checkpoint_wrapped_module.mlp.w`` -> ``model.layers.0.mlp.w``.

    ``peft=True`` also removes peft's leading ``base_model.model.`` (for a module that holds the plain
    model); keep it (the default) where the names must stay peft's, e.g. adapter tensors.
    """
    prefixes = WRAPPER_PREFIXES + ((PEFT_PREFIX,) if peft else ())
    while name.startswith(prefixes):
        name = name[len(next(p for p in prefixes if name.startswith(p))) :]
    previous = None
    while previous != name:
        previous = name
        for part in INNER_WRAPPER_PARTS:
            name = name.replace(part, ".")
    return name
