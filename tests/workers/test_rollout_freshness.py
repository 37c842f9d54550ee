"""The rollout never samples from stale or random weights: the first generation is the checkpoint's,
and after the actor changes, the next generation's log-probs are the actor's (in-process worker)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.agent_loop.base import agent_loop_settings
from hybridflow.agent_loop.manager import AgentLoopManager
from hybridflow.config.loader import load_config
from hybridflow.data.rl_dataset import position_ids_from_mask
from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.worker_setup import build_worker_groups


def _shutdown(groups: dict) -> None:
    """In-process groups hold the rendezvous variables and the gloo group until they are shut down."""
    for group in {id(g): g for g in groups.values()}.values():
        group.shutdown()


def _prompts(tokenizer, texts):
    ids = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for t in texts
    ]
    width = max(map(len, ids))
    input_ids = torch.zeros((len(ids), width), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    raw = np.empty(len(ids), dtype=object)
    raw[:] = ids
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask)},
        non_tensors={"raw_prompt_ids": raw},
    )


def test_first_generation_is_the_checkpoint_and_updates_reach_the_engine(tiny_model_dir, one_torch_thread):
    config = load_config(
        "ppo_trainer",
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "trainer.backend=inprocess",
            "trainer.device=cpu",
            "actor_rollout_ref.rollout.response_length=10",
            "data.max_prompt_length=64",
            "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "data.train_batch_size=4",
        ],
    )
    groups = build_worker_groups(config, use_critic=False, use_ref=False, use_rm=False)
    wg = groups["actor_rollout"]
    manager = None
    try:
        wg.init_model()
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        rollout = dict(config.actor_rollout_ref.rollout)
        manager = AgentLoopManager(
            agent_loop_settings({**rollout, "val_kwargs": dict(rollout["val_kwargs"]), "agent": {"num_workers": 2}}),
            wg,
            tokenizer,
        )
        prompts = _prompts(tokenizer, ["hi", "what is 2+3?", "count: 1 2 3", "x"])

        # 1. greedy first generation == transformers generate on the checkpoint
        out = manager.generate_sequences(_with_meta(prompts, validate=True))
        hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        for i, ids in enumerate(prompts.non_tensor_batch["raw_prompt_ids"]):
            ref = hf.generate(
                torch.tensor([ids]),
                max_new_tokens=10,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                top_k=None,
                top_p=None,
            )[0, len(ids) :]
            n = int(out.batch["response_mask"][i].sum())
            assert out.batch["responses"][i, :n].tolist() == ref.tolist()[:n] and n == len(ref)

        # 2. the actor changes (as an update would): the next generation samples from the new weights
        worker = wg.workers[0]._roles["actor_rollout"]
        with torch.no_grad():
            for p in worker.actor_engine.module.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        worker._rollout_stale = True  # what update_actor sets
        sampled = manager.generate_sequences(_with_meta(prompts, global_steps=1))
        assert sampled.meta_info["metrics"]["rollout/weight_sync_mb"][0] > 0
        recomputed = wg.compute_log_prob(sampled).batch["old_log_probs"]
        mask = sampled.batch["response_mask"].bool()
        diff = (recomputed - sampled.batch["rollout_log_probs"]).abs()[mask]
        assert diff.max() < 1e-4, diff.max()
        # and without the push (stale engine) the same check would fail: the engine's copy is still the old one
        hf_logp = _log_probs(hf, sampled)
        assert (hf_logp - sampled.batch["rollout_log_probs"]).abs()[mask].max() > 1e-2
    finally:
        if manager is not None:
            manager.shutdown()
        _shutdown(groups)


def _with_meta(prompts: DataProto, **meta) -> DataProto:
    return DataProto(batch=prompts.batch, non_tensor_batch=dict(prompts.non_tensor_batch), meta_info=dict(meta))


@torch.no_grad()
def _log_probs(model, data: DataProto) -> torch.Tensor:
    R = data.batch["responses"].size(1)
    logits = model(
        input_ids=data.batch["input_ids"],
        attention_mask=data.batch["attention_mask"],
        position_ids=data.batch["position_ids"],
    ).logits[:, -R - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, data.batch["responses"].unsqueeze(-1)).squeeze(-1)


def test_worker_level_generate_sequences_seeds_by_offset_and_outputs_concatenate(tiny_model_dir, one_torch_thread):
    """``wg.generate_sequences`` (veRL's worker-level call): a slice sent with ``sample_offset`` samples
    what the same rows sample inside the whole batch, and the outputs carry the caller's meta_info
    without the offset, so the slices (or the ranks' parts) concatenate."""
    config = load_config(
        "ppo_trainer",
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "trainer.backend=inprocess",
            "trainer.device=cpu",
            "actor_rollout_ref.rollout.response_length=8",
            "data.max_prompt_length=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "data.train_batch_size=4",
            "actor_rollout_ref.rollout.max_num_seqs=1",
        ],
    )  # one request per engine batch: exact sampling
    groups = build_worker_groups(config, use_critic=False, use_ref=False, use_rm=False)
    wg = groups["actor_rollout"]
    try:
        wg.init_model()
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        prompts = _prompts(tokenizer, ["hi", "what is 2+3?", "count: 1 2 3", "x"])
        whole = wg.generate_sequences(_with_meta(prompts, global_steps=3, tag="t"))
        halves = [
            wg.generate_sequences(_with_meta(prompts[a:b], global_steps=3, tag="t", sample_offset=a))
            for a, b in ((0, 2), (2, 4))
        ]
        wrong = wg.generate_sequences(_with_meta(prompts[2:4], global_steps=3, tag="t"))  # offset 0: other seeds
    finally:
        _shutdown(groups)
    for part in [whole, *halves]:
        assert "sample_offset" not in part.meta_info and part.meta_info["tag"] == "t"
    joined = DataProto.concat(halves)
    assert torch.equal(joined.batch["responses"], whole.batch["responses"])
    assert not torch.equal(wrong.batch["responses"], whole.batch["responses"][2:4])
