"""The log-prob of the sampled token over a large vocabulary from half-precision logits, forward and backward.

The actor's update computes log p(token) from bf16 logits (the lm_head's output under mixed precision) for
every response token; on the H100 profile of 2026-11-27 the vocabulary's passes were a fifth of an update and
the float32 copies of the logits most of its peak memory. ``logprobs_from_logits`` now runs half-precision
logits through ``_LowPrecisionLogProbs`` (float32 row chunks; the backward recomputes the softmax from the
kept bf16 logits and one logsumexp per row). The baseline, measured in the same run, is the previous code:
autograd through ``logits.float()`` chunks, which keeps each float32 chunk for the backward and sums two
vocabulary-sized gradients per chunk.

Per implementation: seconds for forward + backward (median of rounds alternating the two), the bytes autograd
keeps for the backward, and the largest difference from each other (log-probs and gradients). Then the padded
forward's projection onto the vocabulary (``projection``): the R predicting positions as ``logits_to_keep``
indices against the R + 1 last positions kept and sliced.

    python benchmarks/vocab_log_prob.py [--quick] [--tokens N] [--vocab V] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybridflow.utils import torch_functional  # noqa: E402


def autograd_through_chunks(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The previous implementation (until 2026-11-29): float32 chunks, autograd keeps each for the backward."""
    vocab = logits.shape[-1]
    chunk_rows = max(1, torch_functional._LOW_PRECISION_CHUNK_BYTES // (4 * vocab))
    out = []
    for rows, rows_labels in zip(logits.reshape(-1, vocab).split(chunk_rows), labels.reshape(-1).split(chunk_rows)):
        rows = rows.float()
        out.append(rows.gather(-1, rows_labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(rows, dim=-1))
    return torch.cat(out).reshape(labels.shape)


IMPLEMENTATIONS = {
    "autograd through float32 chunks (before)": autograd_through_chunks,
    "_LowPrecisionLogProbs (now)": torch_functional.logprobs_from_logits,
}


def run_once(fn, logits, labels, weights):
    """(seconds, saved bytes, log-probs, gradient) of one forward + backward."""
    leaf = logits.detach().requires_grad_()
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(leaf, labels)
    (out * weights).sum().backward()
    return time.perf_counter() - start, sum(saved), out.detach(), leaf.grad


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tokens", type=int, default=None, help="rows of logits (default 2048; quick 64)")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary (default Qwen2's)")
    p.add_argument("--rounds", type=int, default=None)
    args = p.parse_args(argv)
    tokens = args.tokens or (64 if args.quick else 2048)
    vocab = 4096 if args.quick and args.vocab == 151936 else args.vocab
    rounds = args.rounds or (2 if args.quick else 5)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(tokens, vocab, generator=gen) * 3).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    weights = torch.randn(tokens, generator=gen)

    seconds = {name: [] for name in IMPLEMENTATIONS}
    results = {}
    for i in range(rounds + 1):  # the first round warms up
        names = list(IMPLEMENTATIONS) if i % 2 == 0 else list(IMPLEMENTATIONS)[::-1]
        for name in names:
            s, saved, out, grad = run_once(IMPLEMENTATIONS[name], logits, labels, weights)
            if i:
                seconds[name].append(s)
            results[name] = (saved, out, grad)
    before, now = list(IMPLEMENTATIONS)
    out_diff = float((results[now][1] - results[before][1]).abs().max())
    grad_diff = float((results[now][2].float() - results[before][2].float()).abs().max())
    print(
        f"\n{tokens} rows x {vocab} vocabulary, bf16 logits ({logits.numel() * 2 / 2**20:.0f} MiB), "
        f"{rounds} rounds, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.1f}\n"
    )
    print("| implementation | s forward + backward | vs before | kept for backward | vs before |")
    print("|---|---|---|---|---|")
    rows = {}
    for name in IMPLEMENTATIONS:
        med = statistics.median(seconds[name])
        rows[name] = dict(seconds=med, saved=results[name][0])
        print(
            f"| {name} | {med:.3f} | {med / statistics.median(seconds[before]):.2f}x | "
            f"{results[name][0] / 2**20:.1f} MiB | {results[name][0] / results[before][0]:.2f}x |"
        )
    print(f"\nmax |log-prob difference| {out_diff:.2e}, max |gradient difference| {grad_diff:.2e}")
    rows["projection"] = projection(vocab, rounds, quick=args.quick)
    return rows


def projection(vocab: int, rounds: int, quick: bool) -> dict:
    """The padded forward's projection onto the vocabulary, then the log-prob and the backward, through a
    2-layer thin bf16 Qwen2: ``forward_response_logits`` (now: ``logits_to_keep`` as the R predicting
    positions, contiguous logits) against the previous code (the last R + 1 positions kept, then sliced)."""
    from hybridflow.models.tiny import build_tiny_config, build_tiny_model
    from hybridflow.workers.utils.logprob import forward_response_logits

    config = build_tiny_config(
        vocab_size=vocab, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
    )
    model = build_tiny_model(config, seed=0).to(torch.bfloat16)
    rows, width = (2, 64) if quick else (4, 512)
    response = width // 2
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (rows, width), generator=gen)
    mask = torch.ones_like(ids)
    pos = mask.cumsum(-1) - 1

    def sliced():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=response + 1)
        return out.logits[:, -response - 1 : -1]

    def kept():
        return forward_response_logits(model, ids, mask, pos, response)

    calls = {"R + 1 positions kept, then sliced (before)": sliced, "the R positions as indices (now)": kept}
    with torch.no_grad():
        logit_diff = float((sliced().float() - kept().float()).abs().max())  # the same logits, or no comparison
    seconds = {name: [] for name in calls}
    for i in range(rounds + 1):
        for name in list(calls) if i % 2 == 0 else list(calls)[::-1]:
            start = time.perf_counter()
            torch_functional.logprobs_from_logits(calls[name](), ids[:, -response:]).sum().backward()
            model.zero_grad(set_to_none=True)
            if i:
                seconds[name].append(time.perf_counter() - start)
    before = statistics.median(seconds[list(calls)[0]])
    print(f"\nprojection: {rows} rows x {width} tokens, {response} response positions, 2 thin layers, bf16\n")
    print("| projection | s forward + log-prob + backward | vs before |")
    print("|---|---|---|")
    out = {}
    for name in calls:
        med = statistics.median(seconds[name])
        out[name] = med
        print(f"| {name} | {med:.3f} | {med / before:.2f}x |")
    print(f"\nmax |logit difference| between the two {logit_diff:.2e}")
    out["max_logit_difference"] = logit_diff
    return out


if __name__ == "__main__":
    main()
