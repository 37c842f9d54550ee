"""vllm vs hf rollout engines on the same prompts and model, and the vLLM weight-sync cost per MB.

Used by ``rollout_throughput.py --engines``. Rows, measured in one run, interleaved call by call:

  * hf: ``HFRollout.generate_sequences`` (one batched transformers ``generate`` over all prompts);
  * vllm: ``VLLMServer.generate`` for every prompt at once (asyncio.gather; the engine batches them).

Both sample at temperature 1.0 with ``ignore_eos`` (every request makes exactly ``tokens`` tokens).
Weight sync: the model's full state dict pushed into the engine in buckets of ``--bucket-mb`` MB
(``load_weights`` per bucket + ``finish_weight_update``), ms per MB of weights; the hf engine's
in-place ``load_weights`` beside it. With ``--device cuda`` the vllm rows run twice: without sleep
mode, and with it (``free_cache_engine``): sleep(level) -> wake_up(["weights"]) -> push ->
wake_up(["kv_cache"]), the hybrid engine's cycle, timed as a whole.

Models (random weights; the tiny character tokenizer, so prompts are the tiny task's):
  tiny: hidden 128, 4 layers (0.6M);  small: hidden 512, 8 layers (25M, the issue's size);
  qwen2.5-0.5b: Qwen2.5-0.5B's shapes (hidden 896, 24 layers, 14/2 heads, vocab 151936; 494M).
"""

from __future__ import annotations

import asyncio
import os
import time

import _common as C

SHAPES = {
    "tiny": dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256, vocab_size=None),
    "small": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_size=1536, vocab_size=None),
    "qwen2.5-0.5b": dict(
        hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864, vocab_size=151936
    ),
}


def save_model(out_dir: str, shape: str, max_position_embeddings: int = 2048) -> str:
    """A random-init Qwen2 of the given shape + the tiny character tokenizer, as a Hugging Face directory."""
    from transformers import GenerationConfig

    from hybridflow.models.tiny import build_tiny_config, build_tiny_model, build_tiny_tokenizer

    dims = dict(SHAPES[shape])
    tokenizer = build_tiny_tokenizer(model_max_length=max_position_embeddings)
    vocab = dims.pop("vocab_size") or len(tokenizer)
    config = build_tiny_config(
        vocab_size=vocab,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **dims,
    )
    model = build_tiny_model(config, seed=0)
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def rollout_config(tokens: int, max_model_len: int, n_prompts: int, device: str, sleep: bool) -> dict:
    return {
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "do_sample": True,
        "response_length": tokens,
        "ignore_eos": True,
        "dtype": "auto",
        "load_format": "auto",
        "max_model_len": max_model_len,
        "max_num_seqs": n_prompts,
        "max_num_batched_tokens": 8192,
        "enforce_eager": device == "cpu",
        "gpu_memory_utilization": 0.35,
        "free_cache_engine": sleep,
        "enable_prefix_caching": False,
        "engine_kwargs": {"vllm": {}},
    }


def bucket_iter(state: list, bucket_mb: float):
    """Consecutive slices of (name, tensor) of about ``bucket_mb`` MB each."""
    limit, bucket, size = bucket_mb * 2**20, [], 0
    for name, tensor in state:
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= limit:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


class VLLMRow:
    """One vLLM server on its own engine loop."""

    def __init__(self, model_dir: str, config: dict, device: str, eos: int):
        from hybridflow.config.convert import as_section
        from hybridflow.config.rollout import RolloutConfig, rollout_as_in_yaml
        from hybridflow.rollout.server import EngineLoop, ServerSpec
        from hybridflow.workers.rollout.vllm_server import VLLMServer

        self.loop = EngineLoop()
        typed = as_section(config, RolloutConfig, "rollout", rollout_as_in_yaml)  # the server takes the typed section
        spec = ServerSpec(model_path=model_dir, config=typed, pad_token_id=0, eos_token_ids=(eos,), device=device)

        async def build():
            return VLLMServer(spec)

        start = time.perf_counter()
        self.server = self.loop.run(build())
        self.start_s = time.perf_counter() - start

    def generate(self, prompt_lists, params) -> int:
        async def all_at_once():
            return await asyncio.gather(
                *[self.server.generate(p, params, f"b{i}", logprobs=True) for i, p in enumerate(prompt_lists)]
            )

        return sum(len(o.token_ids) for o in self.loop.run(all_at_once()))

    def push(self, state: list, bucket_mb: float) -> float:
        async def update():
            for bucket in bucket_iter(state, bucket_mb):
                await self.server.load_weights(bucket)
            await self.server.finish_weight_update()

        start = time.perf_counter()
        self.loop.run(update())
        return time.perf_counter() - start

    def sleep_cycle(self, state: list, bucket_mb: float, level: int) -> float:
        """The hybrid engine's cycle: release for training, then weights back, push, KV cache back."""
        start = time.perf_counter()
        self.loop.run(self.server.sleep(level=level))
        self.loop.run(self.server.wake_up(tags=["weights"]))
        self.push(state, bucket_mb)
        self.loop.run(self.server.wake_up(tags=["kv_cache"]))
        return time.perf_counter() - start

    def close(self) -> None:
        self.loop.run(self.server.shutdown())
        self.loop.close()


def compare_engines(args, load_prompts) -> None:
    """``load_prompts(data_dir, model_dir, count, prompt_length) -> (left-padded DataProto, tokenizer)``."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.rollout.sampling import SamplingParams
    from hybridflow.workers.rollout.hf_rollout import HFRollout

    device = args.device
    shape = args.model or ("tiny" if args.quick else "small" if device == "cpu" else "qwen2.5-0.5b")
    prompts_n, tokens = (8, 8) if args.quick else (64, 32)
    repeats = args.repeats or (1 if args.quick else 5)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.set_num_threads(max(1, args.torch_threads))

    with tempfile.TemporaryDirectory(prefix="engine_bench_") as root:
        setup = C.GRPOSetup(train_size=max(64, prompts_n), response_length=tokens)
        data_dir, _ = C.make_assets(root, setup)
        model_dir = save_model(os.path.join(root, "model"), shape)
        batch, tokenizer = load_prompts(data_dir, model_dir, prompts_n, setup.prompt_length)
        mask = batch.batch["attention_mask"].bool()
        prompt_lists = [row[m].tolist() for row, m in zip(batch.batch["input_ids"], mask)]
        max_model_len = batch.batch["input_ids"].size(1) + tokens + 8

        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        mb = sum(t.numel() * t.element_size() for t in hf_model.state_dict().values()) / 2**20
        state = [(k, v) for k, v in hf_model.state_dict().items()]
        config = rollout_config(tokens, max_model_len, prompts_n, device, sleep=False)
        if device == "cpu":  # an explicit KV budget: every prompt at full length, plus a margin
            from hybridflow.workers.rollout.vllm_settings import ModelFacts

            per_token = ModelFacts.from_model_dir(model_dir).kv_bytes_per_token("float32")
            config["engine_kwargs"]["vllm"]["kv_cache_memory_bytes"] = int(per_token * max_model_len * prompts_n * 1.25)
        hf = HFRollout(hf_model, config, tokenizer.pad_token_id, tokenizer.eos_token_id)
        params = SamplingParams(do_sample=True, temperature=1.0, response_length=tokens, ignore_eos=True)

        def hf_call() -> int:
            out = hf.generate_sequences(batch)
            return int(out.batch["attention_mask"][:, -tokens:].sum())

        rows, sync_rows = {}, []
        variants = [("vllm", False)] + ([("vllm + sleep/wake", True)] if device == "cuda" else [])
        for label, sleep in variants:
            engine = VLLMRow(model_dir, dict(config, free_cache_engine=sleep), device, tokenizer.eos_token_id)
            print(f"{label}: engine started in {engine.start_s:.1f} s", flush=True)
            try:
                calls = {"hf": hf_call, label: lambda engine=engine: engine.generate(prompt_lists, params)}
                for fn in calls.values():  # warm-up
                    fn()
                for r in range(repeats):  # interleaved, alternating which goes first
                    for name in list(calls) if r % 2 == 0 else list(calls)[::-1]:
                        start = time.perf_counter()
                        produced = calls[name]()
                        rows.setdefault(name, ([], produced))[0].append(time.perf_counter() - start)
                sync = [engine.push(state, args.bucket_mb) for _ in range(max(2, repeats))]
                sync_rows.append([f"{label}: push", mb, C.median(sync) * 1000, C.median(sync) * 1000 / mb])
                if sleep:
                    for level in (1, 2):
                        cycle = [engine.sleep_cycle(state, args.bucket_mb, level) for _ in range(max(2, repeats))]
                        sync_rows.append(
                            [
                                f"{label}: sleep({level}) + wake + push",
                                mb,
                                C.median(cycle) * 1000,
                                C.median(cycle) * 1000 / mb,
                            ]
                        )
            finally:
                engine.close()
        hf_sync = []
        for _ in range(max(2, repeats)):
            start = time.perf_counter()
            hf.load_weights(state)
            hf_sync.append(time.perf_counter() - start)
        sync_rows.append(["hf: load_weights (in place)", mb, C.median(hf_sync) * 1000, C.median(hf_sync) * 1000 / mb])

    tps = {name: produced / C.median(times) for name, (times, produced) in rows.items()}
    print(
        f"\n{shape} model ({mb:.1f} MB of weights, {dtype}), {prompts_n} prompts x {tokens} new tokens (ignore_eos), "
        f"temperature 1.0, median of {repeats} interleaved calls, device {device}; {C.machine_line()}"
    )
    C.print_table(
        "Rollout engines (tokens/s)",
        ["engine", "tokens", "seconds", "tokens/s", "vs hf"],
        [
            [name, produced, C.median(times), tps[name], tps[name] / tps["hf"]]
            for name, (times, produced) in rows.items()
        ],
    )
    C.print_table(
        f"Weight sync (full state dict, buckets of {args.bucket_mb} MB)", ["what", "MB", "ms", "ms/MB"], sync_rows
    )
    for name in tps:
        if name != "hf":
            print(f"  {name}: {tps[name] / tps['hf']:.2f}x hf tokens/s")
