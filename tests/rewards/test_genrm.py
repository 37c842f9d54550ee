"""The generative reward model's pure parts: the judge's prompt template, the verdict parsers, and the
genrm reward manager with a judge whose verdicts the test writes (a plain function, and a stub rollout
server behind the real client and server interface)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rewards import load_reward_manager
from hybridflow.rewards.genrm import GenRMRewardManager, JudgeNotAttachedError
from hybridflow.rewards.judge_template import DEFAULT_TEMPLATE, JudgeTemplate, load_template
from hybridflow.rewards.verdict_parsers import VERDICT_PARSERS, get_verdict_parser
from hybridflow.rollout.server import AsyncRolloutServer, EngineLoop, TokenOutput

TOK = build_tiny_tokenizer()
PAD, EOS = TOK.pad_token_id, TOK.eos_token_id
P, R = 6, 8


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def make_batch(rows, extra_info=None, raw_prompt=None, reward_score=None):
    """rows: (prompt text, response text, ground truth); prompts left-padded, responses right-padded."""
    prompts, responses, masks = [], [], []
    for prompt, response, _ in rows:
        p, r = ids(prompt), ids(response)
        prompts.append([PAD] * (P - len(p)) + p)
        responses.append(r + [PAD] * (R - len(r)))
        masks.append([0] * (P - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (R - len(r)))
    non_tensors = {
        "data_source": np.array(["tiny"] * len(rows), dtype=object),
        "reward_model": np.array([{"ground_truth": g} for _, _, g in rows], dtype=object),
    }
    for key, value in (("extra_info", extra_info), ("raw_prompt", raw_prompt), ("reward_score", reward_score)):
        if value is not None:
            column = np.empty(len(value), dtype=object)
            column[:] = value
            non_tensors[key] = column
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor(prompts),
            "responses": torch.tensor(responses),
            "attention_mask": torch.tensor(masks),
        },
        non_tensors=non_tensors,
    )


# ------------------------------------------------------------------------------------------- template
def test_template_fills_each_placeholder_and_leaves_other_braces():
    t = JudgeTemplate("Q={question}|A={response}|G={ground_truth}|put it in \\boxed{} {other}")
    assert t.fill("2+2?", "4", 4) == "Q=2+2?|A=4|G=4|put it in \\boxed{} {other}"
    assert t.fill("q", "r", None) == "Q=q|A=r|G=|put it in \\boxed{} {other}"


def test_template_fills_in_one_pass_so_a_response_cannot_pull_in_the_ground_truth():
    t = JudgeTemplate("{response} vs {ground_truth}")
    assert t.fill("q", "{ground_truth}", "SECRET") == "{ground_truth} vs SECRET"
    assert t.fill("{response}", "x", "y") == "x vs y"  # a question is not re-filled either (not in this template)


def test_template_needs_the_response_and_reads_files(tmp_path):
    with pytest.raises(ValueError, match="no \\{response\\} placeholder"):
        JudgeTemplate("Question: {question}")
    with pytest.raises(ValueError, match="non-empty"):
        JudgeTemplate("  ")
    path = tmp_path / "t.txt"
    path.write_text("judge {response}\n")
    assert load_template(template_path=str(path)).fill("q", "r", "g") == "judge r\n"
    assert load_template().text == DEFAULT_TEMPLATE
    with pytest.raises(ValueError, match="one of"):
        load_template("x {response}", str(path))


# ------------------------------------------------------------------------------------------- parsers
@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("boxed", "I think \\boxed{0} no wait \\boxed{ 1 }.", 1.0),
        ("boxed", "score \\boxed{0.75}", 0.75),
        ("boxed", "\\boxed{-2e1}", -20.0),
        ("boxed", "\\boxed{yes}", None),
        ("boxed", "no verdict", None),
        ("boxed", "\\boxed{1e999}", None),  # not finite
        ("score", "Score: 7\nreasoning... final score = 8.5", 8.5),
        ("score", "SCORE:3", 3.0),
        ("score", "scored 9 points", None),
        ("last_number", "between 3 and 10, say 7.", 7.0),
        ("last_number", "none", None),
        ("yes_no", "Yes, it is correct. No doubt.", 1.0),
        ("yes_no", "no; yes", 0.0),
        ("yes_no", "Yesterday nothing", None),
    ],
)
def test_parsers_on_hand_written_verdicts(name, text, expected):
    assert get_verdict_parser(name)(text) == expected


def test_unknown_parser_names_the_known_ones():
    with pytest.raises(KeyError, match="boxed"):
        get_verdict_parser("boxd")
    assert {"boxed", "score", "last_number", "yes_no"} <= set(VERDICT_PARSERS)


# ------------------------------------------------------------------------------------------- manager
class ScriptedJudge:
    """Answers each prompt with the verdict of the first key it contains; records the prompts."""

    def __init__(self, answers: dict):
        self.answers, self.prompts, self.chat_template = answers, [], []

    def __call__(self, prompts, chat_template=True):
        self.prompts += list(prompts)
        self.chat_template.append(chat_template)
        return [next((v for k, v in self.answers.items() if k in p), "no idea") for p in prompts]


ROWS = [("1+1", "2", "2"), ("2+2", "5", "4"), ("3+3", "6", "6"), ("4+4", "8", "8")]


def test_manager_scores_are_the_parsed_verdicts_on_the_last_response_token():
    judge = ScriptedJudge({"A:2": "\\boxed{1}", "A:5": "\\boxed{0}", "A:6": "hmm"})  # "A:8" -> "no idea"
    manager = load_reward_manager(
        "genrm", TOK, num_examine=0, judge=judge, template="Q:{question} A:{response}", unparsable_score=-0.5
    )
    out = manager(make_batch(ROWS), return_dict=True)
    assert judge.prompts == ["Q:1+1 A:2", "Q:2+2 A:5", "Q:3+3 A:6", "Q:4+4 A:8"]  # the decoded prompt as question
    scores = out["reward_tensor"]
    expected = torch.tensor([1.0, 0.0, -0.5, -0.5])
    torch.testing.assert_close(scores.sum(-1), expected)
    lengths = torch.tensor([len(r) for _, r, _ in ROWS])
    assert torch.equal(scores.nonzero()[:, 1], (lengths - 1)[expected != 0])
    assert out["reward_extra_info"]["genrm_parsed"] == [1.0, 1.0, 0.0, 0.0]
    assert out["reward_extra_info"]["genrm_verdict"] == ["\\boxed{1}", "\\boxed{0}", "hmm", "no idea"]
    assert out["reward_metrics"] == {
        "genrm/judged": 4.0,
        "genrm/unparsable": 2.0,
        "genrm/unparsable_ratio": 0.5,
        "genrm/prompt_too_long": 0.0,
    }


def test_question_comes_from_extra_info_then_raw_prompt_and_agent_scores_are_kept():
    judge = ScriptedJudge({"": "score: 3"})
    manager = GenRMRewardManager(
        TOK, 0, judge=judge, template="{question}|{response}|{ground_truth}", parser="score", chat_template=False
    )
    batch = make_batch(
        ROWS[:3],
        extra_info=[{"question": "What is 1+1?"}, None, {"other": 1}],
        raw_prompt=[
            [{"role": "user", "content": "x"}],
            [{"role": "system", "content": "s"}, {"role": "user", "content": "chat 2+2"}],
            None,
        ],
        reward_score=[None, None, 9.0],
    )
    out = manager(batch, return_dict=True)
    assert judge.prompts == ["What is 1+1?|2|2", "chat 2+2|5|4"]  # the row with an agent-loop score is not judged
    assert judge.chat_template == [False]
    torch.testing.assert_close(out["reward_tensor"].sum(-1), torch.tensor([3.0, 3.0, 9.0]))
    assert out["reward_metrics"]["genrm/judged"] == 2.0


def test_too_long_prompts_score_the_unparsable_score_and_are_counted():
    manager = GenRMRewardManager(TOK, 0, judge=lambda prompts, chat_template: [None, "\\boxed{1}"])
    out = manager(make_batch(ROWS[:2]), return_dict=True)
    torch.testing.assert_close(out["reward_tensor"].sum(-1), torch.tensor([0.0, 1.0]))
    assert out["reward_metrics"]["genrm/prompt_too_long"] == 1.0 and out["reward_metrics"]["genrm/unparsable"] == 0.0


def test_bad_settings_and_a_missing_judge_fail_clearly():
    with pytest.raises(ValueError, match="reward.reward_kwargs.tmplate is not a setting"):
        GenRMRewardManager(TOK, 0, tmplate="x")
    with pytest.raises(ValueError, match="custom_reward_function.path must be null"):
        GenRMRewardManager(TOK, 0, compute_score=lambda **kw: 0.0)
    with pytest.raises(KeyError, match="verdict parser"):
        GenRMRewardManager(TOK, 0, parser="nope")
    with pytest.raises(JudgeNotAttachedError, match="reward.reward_model.rollout.name"):
        GenRMRewardManager(TOK, 0)(make_batch(ROWS[:1]))


# ------------------------------------------------------------------- a stub server behind the real client
class FixedVerdictServer(AsyncRolloutServer):
    """A rollout server that answers every prompt whose text contains a key with that key's verdict."""

    def __init__(self, tokenizer, verdicts: dict):
        self.tokenizer, self.verdicts, self.requests = tokenizer, verdicts, []

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        self.requests.append((request_id, params))
        text = self.tokenizer.decode(prompt_ids)
        verdict = next((v for k, v in self.verdicts.items() if k in text), "?")
        return TokenOutput(self.tokenizer.encode(verdict, add_special_tokens=False) + [EOS])

    async def load_weights(self, named_tensors):
        return 0


class _Host:
    def __init__(self, server):
        self.server, self.engine_loop = server, EngineLoop("test-stub-judge")


def test_stub_server_through_the_rollout_judge_client_gives_the_parsed_scores():
    from hybridflow.agent_loop.server_manager import LocalServerHandle
    from hybridflow.rollout.sampling import SamplingParams
    from hybridflow.workers.judge_client import RolloutJudge

    servers = [
        FixedVerdictServer(TOK, {"A:2": "Score: 0.9", "A:5": "score = 0.1"}),
        FixedVerdictServer(TOK, {"A:2": "Score: 0.9", "A:5": "score = 0.1"}),
    ]
    hosts = [_Host(s) for s in servers]
    sampling = SamplingParams(do_sample=False, response_length=16)
    judge = RolloutJudge([LocalServerHandle(h) for h in hosts], TOK, sampling, prompt_length=30)
    try:
        manager = GenRMRewardManager(TOK, 0, judge=judge, template="Q:{question} A:{response}", parser="score")
        long_row = ("9+9", "1" * R, "18")  # 35 chat-templated tokens > 30: never sent (the others: 28)
        out = manager(make_batch(ROWS[:3] + [long_row]), return_dict=True)
        torch.testing.assert_close(out["reward_tensor"].sum(-1), torch.tensor([0.9, 0.1, 0.0, 0.0]))
        assert out["reward_metrics"]["genrm/unparsable"] == 1.0  # "?" for "A:6"
        assert out["reward_metrics"]["genrm/prompt_too_long"] == 1.0
        requests = [r for s in servers for r in s.requests]
        assert len(requests) == 3 and all(p is sampling for _, p in requests)
        assert all(s.requests for s in servers)  # least-loaded routing used both engines
        # the chat template wraps the prompt as one user turn, ready for the assistant's answer
        assert judge.encode("hi") == ids("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        assert judge.encode("hi", chat_template=False) == ids("hi")
    finally:
        judge.close()
        for h in hosts:
            h.engine_loop.close()
