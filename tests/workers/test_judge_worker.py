"""The judge of a generative reward model through the real hf rollout server: a JudgeWorker in an
in-process group serves a tiny model, the RolloutJudge client sends each prompt to it, and the
verdicts must be what Hugging Face ``generate`` writes greedily for the same prompt; the genrm
manager's scores are then those verdicts parsed.

The judge is the tiny model saved with seed 1: on a raw-text prompt it greedily repeats the prompt's
last character ("...=2" -> "222..."), so different responses get different verdicts (with the chat
template every prompt ends in the same "assistant\\n" and every verdict is the same)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.config.convert import as_section
from hybridflow.config.rollout import RolloutConfig, rollout_as_in_yaml
from hybridflow.rewards.genrm import GenRMRewardManager
from hybridflow.rewards.verdict_parsers import get_verdict_parser
from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.single_controller.factory import build_worker_group
from hybridflow.workers.judge_client import RolloutJudge
from hybridflow.workers.judge_worker import JudgeWorker, judge_engine_config
from tests.rewards.test_genrm import make_batch

RESPONSE_LENGTH = 6


def judge_rollout(**overrides) -> RolloutConfig:
    rollout = {
        "name": "hf",
        "dtype": "float32",
        "do_sample": False,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "prompt_length": 60,
        "response_length": RESPONSE_LENGTH,
        "ignore_eos": False,
        "seed": 0,
        "max_num_seqs": 64,
        "free_cache_engine": True,
        "max_model_len": None,
    }
    rollout.update(overrides)
    return as_section(rollout, RolloutConfig, "reward.reward_model.rollout", rollout_as_in_yaml)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory) -> str:
    from hybridflow.models.tiny import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("judge")), seed=1)


@pytest.fixture
def judge(judge_dir, one_torch_thread):
    from transformers import AutoTokenizer

    group = build_worker_group(
        "inprocess",
        ClassWithInitArgs(JudgeWorker, model_path=judge_dir, rollout=judge_rollout(), trust_remote_code=False),
        [1],
        name="judge",
    )
    client = None
    try:
        group.init_model()
        client = RolloutJudge.from_group(group, None, AutoTokenizer.from_pretrained(judge_dir), judge_rollout())
        yield client
    finally:
        if client is not None:
            client.close()
        group.shutdown_judge()
        group.shutdown()


def hf_greedy(model_dir: str, prompts: list[str], chat_template: bool) -> list[str]:
    """Independent reference: transformers' own greedy generate, one prompt at a time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    out = []
    for prompt in prompts:
        if chat_template:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        with torch.no_grad():
            tokens = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=RESPONSE_LENGTH,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
            )
        out.append(tokenizer.decode(tokens[0, ids.shape[1] :], skip_special_tokens=True))
    return out


def test_hf_judge_verdicts_are_greedy_generate(judge, judge_dir):
    prompts = ["Grade: 1+1=2", "Grade: 2+2=5", "x" * 100]  # the last one is longer than prompt_length (60)
    for chat_template in (False, True):
        expected = hf_greedy(judge_dir, prompts[:2], chat_template)
        assert judge(prompts, chat_template=chat_template) == expected + [None]
    assert len(set(hf_greedy(judge_dir, prompts[:2], False))) == 2  # the raw verdicts differ (the test can fail)


def test_genrm_scores_are_the_parsed_verdicts_of_the_hf_judge(judge, judge_dir):
    rows = [("1+1", "2", "2"), ("2+2", "5", "4"), ("3+3", "x", "6")]
    template = "Grade: {question}={response}"
    manager = GenRMRewardManager(
        judge.tokenizer,
        0,
        judge=judge,
        template=template,
        parser="last_number",
        unparsable_score=-1.0,
        chat_template=False,
    )
    out = manager(make_batch(rows), return_dict=True)
    verdicts = hf_greedy(judge_dir, [template.format(question=q, response=r) for q, r, _ in rows], False)
    parse = get_verdict_parser("last_number")
    expected = [parse(v) if parse(v) is not None else -1.0 for v in verdicts]
    assert out["reward_extra_info"]["genrm_verdict"] == verdicts
    torch.testing.assert_close(out["reward_tensor"].sum(-1), torch.tensor(expected))
    assert len(set(expected)) > 1, verdicts  # not a constant judge


def test_max_model_len_defaults_to_prompt_plus_response_length():
    assert judge_engine_config(judge_rollout()).max_model_len == 60 + RESPONSE_LENGTH
    assert judge_engine_config(judge_rollout(max_model_len=64)).max_model_len == 64


def test_an_in_process_groups_shutdown_stops_its_judge_engine(judge_dir, one_torch_thread):
    """The group's shutdown alone (no shutdown_judge first) stops the engine: its loop thread ends, as a Ray
    group's engine ends with its process; in process it would otherwise live, model and all, until exit."""
    import threading

    group = build_worker_group(
        "inprocess",
        ClassWithInitArgs(JudgeWorker, model_path=judge_dir, rollout=judge_rollout(), trust_remote_code=False),
        [1],
        name="judge",
    )
    try:
        group.init_model()
        worker = group.workers[0]
        loop_thread = worker.engine_loop._thread
        assert loop_thread.is_alive() and worker.server is not None
    finally:
        group.shutdown()
    loop_thread.join(10)
    assert not loop_thread.is_alive() and worker.server is None
    assert not [t for t in threading.enumerate() if t.name == loop_thread.name]


def test_a_judge_with_full_determinism_turns_it_on(judge_dir, one_torch_thread, restore_torch_switches):
    """reward.reward_model.rollout.full_determinism: the judge's worker turns on deterministic kernels with the
    engine's seed (a teacher's pool is a process of its own: nothing else would), and its hf engine serves
    one sequence at a time."""
    torch.use_deterministic_algorithms(False)
    group = build_worker_group(
        "inprocess",
        ClassWithInitArgs(JudgeWorker, model_path=judge_dir, rollout=judge_rollout(full_determinism=True)),
        [1],
        name="judge-determinism",
    )
    try:
        group.init_model()
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        group.shutdown_judge()
        group.shutdown()
