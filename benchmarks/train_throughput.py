"""Padded vs padding-free (packed) vs packed + dynamic batch: one actor PPO update on a length-skewed batch.

Lengths are drawn so that the mean total length is about a quarter of the longest, as in RL batches
where a few responses run to the limit. Each configuration runs the same ``DataParallelPPOActor``
update (forward + backward + optimizer step) on the same rows; we report valid tokens per second and
the peak accelerator memory (CUDA only; CPU has no per-allocation peak counter worth trusting).
A second table times one weight transition (training engine -> rollout engine) next to a plain
state_dict copy of the same model.

    python benchmarks/train_throughput.py [--rows 32] [--max_len 512] [--hidden 256] [--layers 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybridflow.protocol import DataProto  # noqa: E402
from hybridflow.workers.actor import DataParallelPPOActor  # noqa: E402


def skewed_batch(rows: int, max_len: int, vocab: int, seed: int = 0, device="cpu") -> DataProto:
    """Prompt length P = max_len // 4 (left padded), response width R = max_len - P (right padded).
    Response lengths: 1 in 8 rows run to R, the rest are short, so mean total ~ max_len / 4."""
    gen = torch.Generator().manual_seed(seed)
    prompt_w, resp_w = max_len // 4, max_len - max_len // 4
    prompt_lens = torch.randint(prompt_w // 4, prompt_w + 1, (rows,), generator=gen)
    resp_lens = torch.randint(1, max(2, resp_w // 12), (rows,), generator=gen)
    resp_lens[::8] = resp_w  # the long tail
    pm = (torch.arange(prompt_w) >= prompt_w - prompt_lens[:, None]).long()
    rm = (torch.arange(resp_w) < resp_lens[:, None]).long()
    attention_mask = torch.cat([pm, rm], dim=1)  # (B, S)
    input_ids = torch.randint(1, vocab, attention_mask.shape, generator=gen) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    shape = (rows, resp_w)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": input_ids[:, prompt_w:],
        "response_mask": rm,
        "old_log_probs": -torch.rand(shape, generator=gen) * 3,
        "advantages": torch.randn(shape, generator=gen),
    }
    return DataProto.from_dict(tensors={k: v.to(device) for k, v in tensors.items()}, meta_info={"temperature": 1.0})


def build_model(hidden: int, layers: int, vocab: int, max_len: int, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=max_len,
        tie_word_embeddings=False,
    )
    if device == "cuda":
        try:
            import flash_attn  # noqa: F401

            config._attn_implementation = "flash_attention_2"
        except ImportError:
            pass
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype)


def time_updates(base, data, configs: dict, repeats: int, device: str) -> dict[str, tuple[float, float | None]]:
    """Median seconds of one update_policy call per configuration and its peak CUDA memory (GiB).

    The configurations take turns (A B C A B C ...) so that load drifting on a shared machine hits
    them alike; each is warmed up once first (and runs its one-time packed-attention check)."""
    actors = {}
    for name, config in configs.items():
        model = copy.deepcopy(base)
        actors[name] = DataParallelPPOActor(config, model, torch.optim.AdamW(model.parameters(), lr=1e-6))
        actors[name].update_policy(data)
    times = {name: [] for name in configs}
    peaks = {name: 0.0 for name in configs}
    for _ in range(repeats):
        for name, actor in actors.items():
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            actor.update_policy(data)
            if device == "cuda":
                torch.cuda.synchronize()
                peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated() / 2**30)
            times[name].append(time.perf_counter() - start)
    return {name: (sorted(t)[len(t) // 2], peaks[name] if device == "cuda" else None) for name, t in times.items()}


def time_weight_transition(base, repeats: int) -> tuple[float, float]:
    """(TrainEngine.full_state_dict + HFRollout.load_weights, plain state_dict clone) in seconds."""
    from hybridflow.workers.engine import EngineSpec, TrainEngine
    from hybridflow.workers.rollout import HFRollout

    device = next(base.parameters()).device.type
    engine = TrainEngine(copy.deepcopy(base), EngineSpec(strategy="none", device=device))
    rollout = HFRollout(copy.deepcopy(base).eval(), {"response_length": 1}, 0, 1)
    sync, plain = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        rollout.load_weights(engine.full_state_dict())
        if device == "cuda":
            torch.cuda.synchronize()
        sync.append(time.perf_counter() - start)
        start = time.perf_counter()
        _ = {k: v.detach().clone() for k, v in base.state_dict().items()}
        if device == "cuda":
            torch.cuda.synchronize()
        plain.append(time.perf_counter() - start)
    return sorted(sync)[len(sync) // 2], sorted(plain)[len(plain) // 2]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max_len", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch (fixed-size configurations)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    data = skewed_batch(args.rows, args.max_len, args.vocab, device=args.device)
    mask = data.batch["attention_mask"]
    tokens = int(mask.sum())
    lens = mask.sum(-1).float()
    base = build_model(args.hidden, args.layers, args.vocab, args.max_len, args.device)
    common = {
        "ppo_mini_batch_size": args.rows,
        "ppo_epochs": 1,
        "grad_clip": 1.0,
        "clip_ratio": 0.2,
        "loss_agg_mode": "token-mean",
        "policy_loss": {"loss_mode": "vanilla"},
    }
    # dynamic bsz gets the token cap the fixed split needs for its heaviest micro-batch (same peak
    # activation memory), and packs the rows into as few balanced micro-batches as fit under it
    budget = max(int(chunk.sum()) for chunk in lens.split(args.micro))
    configs = {
        "padded": dict(common, ppo_micro_batch_size_per_gpu=args.micro),
        "padding-free": dict(common, ppo_micro_batch_size_per_gpu=args.micro, use_remove_padding=True),
        "padding-free + dynamic bsz": dict(
            common,
            use_dynamic_bsz=True,
            ppo_max_token_len_per_gpu=max(budget, int(lens.max())),
            use_remove_padding=True,
        ),
    }
    print(
        f"device={args.device} attn={base.config._attn_implementation} "
        f"params={sum(p.numel() for p in base.parameters()) / 1e6:.1f}M "
        f"rows={args.rows} width={mask.shape[1]} valid tokens={tokens} (mean len {lens.mean():.0f}, max "
        f"{lens.max():.0f}, "
        f"padding {100 * (1 - tokens / mask.numel()):.0f}%)"
    )
    print(f"dynamic bsz token budget: {budget} (the heaviest fixed micro-batch of {args.micro} rows)")
    print(f"{'configuration':<28} {'s/update':>9} {'tokens/s':>10} {'peak GiB':>9} {'vs padded':>9}")
    results = {}
    for name, (seconds, peak) in time_updates(base, data, configs, args.repeats, args.device).items():
        results[name] = tokens / seconds
        ratio = results[name] / results["padded"]
        peak_s = f"{peak:.2f}" if peak is not None else "n/a"
        print(f"{name:<28} {seconds:>9.3f} {results[name]:>10.0f} {peak_s:>9} {ratio:>8.2f}x")

    sync, plain = time_weight_transition(base, args.repeats)
    print(
        f"\nweight transition (engine -> rollout): {sync * 1e3:.1f} ms; plain state_dict clone: {plain * 1e3:.1f} ms; "
        f"ratio {sync / plain:.2f}x"
    )
    results["weight_transition_ratio"] = sync / plain
    return results


if __name__ == "__main__":
    main()
