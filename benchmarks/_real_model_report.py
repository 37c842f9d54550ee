"""The arithmetic and verdicts of ``real_model.py``, kept free of torch and vLLM so a fast test checks them.

Conventions: FLOPs of training are 6 x parameters x tokens (forward 2, backward 4, per parameter per
token); an fp32 matmul of (n, k) @ (k, m) is 2 n k m FLOPs; the memory a full fine-tuning step cannot
do without is fp32 weights + gradients + Adam's two moments, 4 x 4 bytes per parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

ADAM_FP32_BYTES_PER_PARAM = 4 * 4  # weights, gradients, exp_avg, exp_avg_sq


def train_flops(params: int, tokens: int) -> float:
    """FLOPs of one forward + backward over ``tokens`` tokens of a ``params``-parameter model."""
    return 6.0 * params * tokens


def matmul_flops(n: int, k: int, m: int) -> float:
    """FLOPs of (n, k) @ (k, m): one multiply and one add per term."""
    return 2.0 * n * k * m


def training_state_bytes(params: int) -> int:
    """Weights + gradients + Adam states of ``params`` fp32 parameters, in bytes."""
    return ADAM_FP32_BYTES_PER_PARAM * params


def tokens_per_second(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else float("nan")


@dataclass(frozen=True)
class Goal:
    """``value`` must be ``>=`` or ``<=`` ``target`` (issue 21 point 5's goals are ratios)."""

    name: str
    value: float
    op: str
    target: float

    def __post_init__(self):
        if self.op not in (">=", "<="):
            raise ValueError(f"goal {self.name!r}: op must be '>=' or '<=', got {self.op!r}")

    @property
    def passed(self) -> bool:
        return self.value >= self.target if self.op == ">=" else self.value <= self.target

    def line(self) -> str:
        return f"{self.name}: {self.value:.3g} (goal {self.op} {self.target:g}) -> {'PASS' if self.passed else 'MISS'}"


def replace_overrides(overrides: list[str], new: list[str]) -> list[str]:
    """``overrides`` (``key=value`` strings) with every key of ``new`` set to ``new``'s value, once."""
    keys = {item.split("=", 1)[0] for item in new}
    return [item for item in overrides if item.split("=", 1)[0] not in keys] + list(new)


def median(values) -> float:
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A Markdown table (numbers with 3 significant digits, or as integers when >= 1000)."""

    def cell(x) -> str:
        if isinstance(x, float):
            return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
        return str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)
