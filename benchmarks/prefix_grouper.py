"""The shared-prompt forward (``actor.use_prefix_grouper``) against the ordinary padded forward, GRPO n = 8.

    python benchmarks/prefix_grouper.py [--prompts 16] [--n 8] [--prompt-length 96] [--response-length 32] [--quick]

A GRPO batch holds every prompt n times. The ordinary padded forward runs all B = prompts × n rows over
prompt + response; the shared-prompt path runs each distinct prompt once with a KV cache and the B
responses on top of it. Both are timed as the actor uses them in an update: log-probs forward plus
backward of their sum, interleaved (ordinary, shared, ordinary, ...) so the machine's load hits both
alike; the table gives the median per path, the speed-up (ordinary / shared) and the largest log-prob
difference between the two (they must agree to float rounding).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402

from hybridflow.models.tiny import build_tiny_config, build_tiny_model  # noqa: E402
from hybridflow.workers.actor import shared_prefix  # noqa: E402
from hybridflow.workers.utils.logprob import forward_response_token_stats  # noqa: E402


def grpo_batch(prompts: int, n: int, prompt_length: int, response_length: int, vocab: int, seed: int = 0):
    """Left-padded prompts of 75-100 % of ``prompt_length`` tokens, each repeated n times, and n different
    full-length responses: (input_ids, attention_mask, position_ids)."""
    g = torch.Generator().manual_seed(seed)
    rows_ids, rows_mask = [], []
    for _ in range(prompts):
        length = int(torch.randint(int(prompt_length * 0.75), prompt_length + 1, (1,), generator=g))
        prompt = torch.randint(3, vocab, (length,), generator=g)
        for _ in range(n):
            response = torch.randint(3, vocab, (response_length,), generator=g)
            pad = prompt_length - length
            rows_ids.append(torch.cat([torch.zeros(pad, dtype=torch.long), prompt, response]))
            rows_mask.append(
                torch.cat([torch.zeros(pad, dtype=torch.long), torch.ones(length + response_length, dtype=torch.long)])
            )
    input_ids, attention_mask = torch.stack(rows_ids), torch.stack(rows_mask)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def time_path(model, batch, response_length: int, shared: bool) -> tuple[float, torch.Tensor]:
    input_ids, attention_mask, position_ids = batch
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    if shared:
        groups = shared_prefix.prompt_groups(input_ids, attention_mask, input_ids.size(1) - response_length)
        log_probs, _, _ = shared_prefix.response_log_probs(
            model,
            input_ids,
            attention_mask,
            position_ids,
            response_length,
            temperature=1.0,
            calculate_entropy=False,
            groups=groups,
        )
    else:
        log_probs, _, _ = forward_response_token_stats(
            model, input_ids, attention_mask, position_ids, response_length=response_length
        )
    log_probs.sum().backward()
    return time.perf_counter() - start, log_probs.detach()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=96)
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.n, args.prompt_length, args.response_length = 2, 4, 16, 8
        args.hidden, args.layers, args.repeats = 64, 2, 1
    torch.set_num_threads(args.torch_threads)
    vocab = 512
    config = build_tiny_config(
        vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=args.hidden * 2,
    )
    model = build_tiny_model(config, seed=0).train()
    if not shared_prefix.usable(model):
        raise RuntimeError("the model cannot take the shared-prompt path (see shared_prefix.usable)")
    batch = grpo_batch(args.prompts, args.n, args.prompt_length, args.response_length, vocab)
    times = {False: [], True: []}
    outputs = {}
    for _ in range(args.repeats):
        for shared in (False, True):
            seconds, log_probs = time_path(model, batch, args.response_length, shared)
            times[shared].append(seconds)
            outputs[shared] = log_probs
    ordinary, grouped = statistics.median(times[False]), statistics.median(times[True])
    diff = float((outputs[False] - outputs[True]).abs().max())
    rows = args.prompts * args.n
    print(
        f"{rows} rows = {args.prompts} prompts x n={args.n}, prompt <= {args.prompt_length}, response "
        f"{args.response_length} tokens; model hidden {args.hidden} x {args.layers} layers; torch threads "
        f"{args.torch_threads}; load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'path':<34}{'median s (fwd+bwd)':>20}")
    print(f"{'ordinary padded forward':<34}{ordinary:>20.3f}")
    print(f"{'shared prompt (use_prefix_grouper)':<34}{grouped:>20.3f}")
    print(f"speed-up {ordinary / grouped:.2f}x; max |log-prob difference| {diff:.2e}")
    return {"ordinary_s": ordinary, "shared_s": grouped, "speedup": ordinary / grouped, "max_diff": diff}


if __name__ == "__main__":
    main()
