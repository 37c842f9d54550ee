"""Masked statistics and log-prob / entropy helpers against direct computations."""

import math

import numpy as np
import pytest
import torch

from hybridflow.utils import torch_functional as F


def _data():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 6, generator=g) > 0.4).double()
    mask[0, 0] = 1
    return values, mask


def test_masked_stats_match_numpy_on_selected_elements():
    values, mask = _data()
    sel = values[mask.bool()].numpy()
    assert F.masked_sum(values, mask).item() == pytest_approx(sel.sum())
    assert F.masked_mean(values, mask).item() == pytest_approx(sel.mean())
    assert F.masked_var(values, mask).item() == pytest_approx(sel.var(ddof=1))
    assert F.masked_var(values, mask, unbiased=False).item() == pytest_approx(sel.var())
    white = F.masked_whiten(values, mask)[mask.bool()].numpy()
    np.testing.assert_allclose(white, (sel - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8))
    kept = F.masked_whiten(values, mask, shift_mean=False)[mask.bool()].numpy()
    np.testing.assert_allclose(kept, (sel - sel.mean()) / np.sqrt(sel.var(ddof=1) + 1e-8) + sel.mean())
    # per-row mean along an axis
    row = F.masked_mean(values, mask, axis=-1)
    for i in range(4):
        m = mask[i].bool()
        expected = values[i][m].mean().item() if m.any() else 0.0
        assert row[i].item() == pytest_approx(expected)


def test_masked_positions_may_hold_inf():
    values, mask = _data()
    poisoned = values.masked_fill(~mask.bool(), float("-inf"))
    torch.testing.assert_close(F.masked_mean(poisoned, mask), F.masked_mean(values, mask))
    assert F.masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_logprobs_from_logits_matches_log_softmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 11, generator=g) * 4
    labels = torch.randint(0, 11, (3, 5), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(F.logprobs_from_logits(logits, labels), ref)
    # bf16 logits: chunked float32 path, compared with the float32 answer on the same (rounded) logits
    lo = logits.to(torch.bfloat16)
    ref_lo = torch.log_softmax(lo.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    out = F.logprobs_from_logits(lo, labels)
    assert out.shape == labels.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, ref_lo)


@pytest.mark.parametrize("chunk_rows", [4, 15, 100])  # 15 rows: chunks of 4, 4, 4, 3; one chunk; one chunk
def test_logprobs_of_half_precision_logits_and_their_gradient_in_chunks(monkeypatch, chunk_rows):
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(3, 5, 11, generator=g) * 4).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 11, (3, 5), generator=g)
    weights = torch.randn(3, 5, generator=g)
    monkeypatch.setattr(F, "_LOW_PRECISION_CHUNK_BYTES", 4 * 11 * chunk_rows)
    out = F.logprobs_from_logits(logits, labels)
    (out * weights).sum().backward()
    # independently: float64 log-softmax of the same (rounded) logits, its gradient by autograd
    exact = logits.detach().double().requires_grad_()
    ref = torch.log_softmax(exact, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    (ref * weights.double()).sum().backward()
    assert out.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(logits.grad.double(), exact.grad, rtol=1e-2, atol=1e-2)  # written in bf16


def test_half_precision_log_probs_keep_no_float32_copy_for_the_backward():
    """What autograd keeps for the backward: the bf16 logits and a float per row, not float32 logits."""
    logits = torch.randn(64, 1000).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 1000, (64,))
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.logprobs_from_logits(logits, labels)
    assert sum(saved) <= logits.numel() * 2 + 64 * (8 + 4)  # bf16 logits + int64 labels + float32 logsumexp


def test_entropy_from_logits():
    logits = torch.zeros(2, 8)  # uniform -> ln 8
    torch.testing.assert_close(F.entropy_from_logits(logits), torch.full((2,), math.log(8.0)))
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 9, generator=g) * 3
    ref = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(F.entropy_from_logits(logits), ref)


def pytest_approx(x):
    # masked_mean divides by (count + 1e-8), as veRL does: agreement to ~1e-8 relative
    return pytest.approx(float(x), rel=1e-7, abs=1e-12)


def test_expand_as_nested_repeats_each_sequence_value_over_its_tokens():
    nested = torch.nested.as_nested_tensor([torch.zeros(3), torch.zeros(1), torch.zeros(2)], layout=torch.jagged)
    out = F.expand_as_nested(torch.tensor([1.0, 2.0, 3.0]), nested)
    assert out.is_nested and [t.tolist() for t in out.unbind()] == [[1.0, 1.0, 1.0], [2.0], [3.0, 3.0]]
    with pytest.raises(ValueError, match="nested"):
        F.expand_as_nested(torch.tensor([1.0]), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="2 values for 3 sequences"):
        F.expand_as_nested(torch.tensor([1.0, 2.0]), nested)
