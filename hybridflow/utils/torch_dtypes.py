"""Dtype names from the config (``bf16``, ``fp32``, ``auto``, ...) as torch spells them."""

from __future__ import annotations

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


def resolve_dtype(value: str | None, device: str) -> str:
    """A dtype name from the config -> a torch dtype name (``getattr(torch, name)``).

    ``auto`` (and None) is bfloat16 on cuda, float32 on cpu: bf16 matmuls are slow on most CPUs, and
    fp32 keeps rollout and trainer log-probs equal. Aliases: bf16, fp16, half, fp32, float; any other
    name is returned lower-cased as it is.
    """
    name = str(value or "auto").lower()
    if name == "auto":
        return "bfloat16" if str(device).startswith("cuda") else "float32"
    return DTYPE_ALIASES.get(name, name)


def cpu_has_fast_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX or AVX512-BF16): there bf16 matmuls run several
    times faster than fp32, elsewhere slower. False where the flags cannot be read (not Linux)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags
