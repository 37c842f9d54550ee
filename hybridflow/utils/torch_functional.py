"""Small tensor helpers shared by the RL math and the workers (veRL's ``verl.utils.torch_functional``).

Masks are 0/1 (bool, int or float) tensors broadcastable to the values; masked-out positions may
hold anything (even ``-inf``/NaN) without leaking into the result. None of these helpers syncs with
the host, so they are safe inside a training step.
"""

from __future__ import annotations

import torch

__all__ = [
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "clip_by_value",
    "entropy_from_logits",
    "sum_pi_squared_from_logits",
    "logprobs_from_logits",
    "expand_as_nested",
]


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set (over all elements, or along ``axis``)."""
    masked = torch.where(mask.bool(), values, torch.zeros_like(values))
    return masked.sum() if axis is None else masked.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is set; an empty mask gives 0 (veRL adds 1e-8 to the count)."""
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked values (Bessel-corrected when ``unbiased``, like ``torch.var``).

    With fewer than two valid elements the unbiased correction is skipped instead of raising, so the
    function never needs a host sync; the variance of one element is 0 either way.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum().to(variance.dtype)
        variance = variance * torch.where(n > 1, n / (n - 1).clamp(min=1), torch.ones_like(n))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise to zero mean and unit (unbiased) variance over the masked elements.

    With ``shift_mean=False`` the original mean is added back (only the scale changes).
    Positions outside the mask are transformed too but carry no meaning.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Element-wise clamp between two tensors (``torch.clamp`` with tensor bounds)."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution over the last dim: logsumexp(z) - sum(softmax(z) * z)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_v softmax(z)_v^2 over the last dim (the collision probability; the optimal token
    baseline's score norm needs it), as exp(logsumexp(2z) - 2 logsumexp(z)): no softmax kept.
    Half-precision logits are upcast to float32."""
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    return torch.exp(torch.logsumexp(2 * logits, dim=-1) - 2 * torch.logsumexp(logits, dim=-1))


# Float32 bytes of (rows, vocab) processed at once when the logits are half precision: each chunk is
# upcast to float32, so memory stays bounded by the chunk instead of a float32 copy of all the logits. A
# byte budget, not a row count: fewer, larger kernels for small vocabularies (a GPU update launches each
# chunk's ops), the same bound for large ones (441 rows of Qwen2's 151,936 tokens).
_LOW_PRECISION_CHUNK_BYTES = 256 << 20


def _chunks(rows: int, chunk_rows: int):
    return ((start, min(start + chunk_rows, rows)) for start in range(0, rows, chunk_rows))


class _LowPrecisionLogProbs(torch.autograd.Function):
    """log p(label) of half-precision ``logits (N, V)`` in float32 row chunks. Autograd through the chunks
    would keep every chunk's float32 copy for the backward (twice the logits' own bytes: ~5 GB for 8,192
    tokens of Qwen2's vocabulary) and sum two vocabulary-sized gradients per chunk; this keeps the
    half-precision logits and each row's logsumexp, and writes d/dz = g * (onehot(label) - softmax(z)) chunk
    by chunk into one tensor of the logits' dtype."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_rows: int) -> torch.Tensor:
        rows = logits.size(0)
        out = torch.empty(rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for start, end in _chunks(rows, chunk_rows):
            chunk = logits[start:end].float()
            lse[start:end] = torch.logsumexp(chunk, dim=-1)
            out[start:end] = chunk.gather(-1, labels[start:end].unsqueeze(-1)).squeeze(-1) - lse[start:end]
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_rows = chunk_rows
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start, end in _chunks(logits.size(0), ctx.chunk_rows):
            g = grad_out[start:end].float().unsqueeze(-1)  # (n, 1)
            chunk = (logits[start:end].float() - lse[start:end].unsqueeze(-1)).exp_().mul_(-g)  # -g * softmax
            chunk.scatter_add_(-1, labels[start:end].unsqueeze(-1), g)  # + g at the label
            grad[start:end] = chunk
        return grad, None, None


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) for every position: ``logits (..., V)``, ``labels (...)`` -> ``(...)``.

    Computed as ``logit[label] - logsumexp(logits)``, which never materialises the full
    log-softmax (one (..., V) tensor fewer than ``log_softmax(...).gather``). Half-precision logits
    are handled in float32 row chunks for accuracy (``_LowPrecisionLogProbs``: the backward keeps no
    float32 copy of them); the result keeps float32 in that case.
    """
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)

    vocab = logits.shape[-1]
    chunk_rows = max(1, _LOW_PRECISION_CHUNK_BYTES // (4 * vocab))
    flat = _LowPrecisionLogProbs.apply(logits.reshape(-1, vocab), labels.reshape(-1), chunk_rows)
    return flat.reshape(labels.shape)


def expand_as_nested(tensor: torch.Tensor, nested_tensor: torch.Tensor) -> torch.Tensor:
    """A per-sequence value ``tensor`` (B,) repeated over every position of a jagged nested tensor
    (B, j): the per-token layout of padding-free batches (e.g. one advantage per response)."""
    if not nested_tensor.is_nested:
        raise ValueError("expand_as_nested: nested_tensor must be a (jagged) nested tensor")
    if tensor.dim() != 1:
        raise ValueError(
            f"expand_as_nested: tensor must be 1-D (one value per sequence), got shape {tuple(tensor.shape)}"
        )
    if nested_tensor.dim() != 2:
        raise ValueError(f"expand_as_nested: nested_tensor must be (batch, jagged), got {nested_tensor.dim()} dims")
    if tensor.shape[0] != nested_tensor.size(0):
        raise ValueError(f"expand_as_nested: {tensor.shape[0]} values for {nested_tensor.size(0)} sequences")
    offsets = nested_tensor.offsets()  # (B + 1,)
    values = torch.repeat_interleave(tensor, offsets.diff(), dim=0)  # (total tokens,)
    return torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)
