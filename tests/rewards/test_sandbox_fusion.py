"""``reward.sandbox_fusion``: the code scorer's tests run in a SandboxFusion service.

The service here is a small stand-in speaking SandboxFusion's run_code protocol on 127.0.0.1: it runs each
posted program in a plain ``python -I`` subprocess with the posted stdin and timeout and answers in the
service's shapes. Expected scores come from the local sandbox (the same tests, run without the service), so a
client that sent the wrong program, input or limits, or read the answer wrongly, scores differently.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.config.reward import CustomRewardFunctionConfig, RewardConfig, RewardManagerConfig, SandboxFusionConfig
from hybridflow.main_ppo import checked_config
from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rewards import sandbox_fusion
from hybridflow.rewards.manager import BatchRewardManager, NaiveRewardManager
from hybridflow.rewards.scorers import code_sandbox, default_compute_score
from hybridflow.rewards.streaming import RewardRecipe, sandbox_scorer

FAST = dict(timeout_s=3.0, memory_mb=256)
DOUBLE = {"inputs": ["1\n", "2\n", "5\n"], "outputs": ["2\n", "4\n", "10\n"]}
ADD = {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [[3], 7]}


def fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}\n```"


class StandIn:
    """SandboxFusion's run_code on 127.0.0.1: runs the program, records each request and the most in flight;
    ``fail_next`` holds HTTP statuses to answer first, ``answer_next`` whole answers to send first."""

    def __init__(self, delay_s: float = 0.0):
        self.requests: list[dict] = []
        self.fail_next: list[int] = []
        self.answer_next: list[dict] = []
        self.delay_s, self.in_flight, self.most_in_flight = delay_s, 0, 0
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stand_in.lock:
                    stand_in.requests.append(payload)
                    status = stand_in.fail_next.pop(0) if stand_in.fail_next else 200
                    forced = stand_in.answer_next.pop(0) if stand_in.answer_next and status == 200 else None
                    stand_in.in_flight += 1
                    stand_in.most_in_flight = max(stand_in.most_in_flight, stand_in.in_flight)
                try:
                    answer = forced or stand_in.run(payload)
                finally:
                    with stand_in.lock:
                        stand_in.in_flight -= 1
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/run_code"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def run(self, payload: dict) -> dict:
        time.sleep(self.delay_s)
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", payload["code"]],
                input=payload["stdin"] or "",
                capture_output=True,
                text=True,
                timeout=payload["run_timeout"],
            )
        except subprocess.TimeoutExpired:
            return {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "stdout": "", "stderr": ""}}
        run = {"status": "Finished", "stdout": done.stdout, "stderr": done.stderr, "return_code": done.returncode}
        return {"status": "Success" if done.returncode == 0 else "Failed", "run_result": run, "compile_result": None}

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def service():
    stand_in = StandIn()
    yield stand_in
    stand_in.close()


SOLUTIONS = [
    ("print(int(input()) * 2)", DOUBLE),  # all pass
    ("n = int(input())\nprint(n * 2 if n < 3 else n * 2 - 1)", DOUBLE),  # 2 of 3
    ("raise SystemExit(3)", DOUBLE),  # error
    ("def add(a, b):\n    return a + b", ADD),  # call tests
    ("class Solution:\n    def add(self, a, b):\n        return a + b if a < 3 else 0", ADD),  # a method, 1 of 2
]


@pytest.mark.parametrize("code,truth", SOLUTIONS)
def test_a_service_run_scores_as_the_local_sandbox_does(service, code, truth):
    local = code_sandbox.compute_score(fenced(code), truth, **FAST)
    remote = code_sandbox.compute_score(fenced(code), truth, **FAST, sandbox_fusion_url=service.url)
    assert {k: remote[k] for k in ("score", "passed", "total", "reason")} == {
        k: local[k] for k in ("score", "passed", "total", "reason")
    }
    assert remote["isolation"] == f"SandboxFusion service {service.url}"
    assert len(service.requests) == len(truth["inputs"])  # one run per test
    request = service.requests[0]
    assert request["language"] == "python" and request["memory_limit_MB"] == 256 and request["run_timeout"] == 3.0


def test_a_timeout_in_the_service_is_a_timeout(service):
    result = code_sandbox.compute_score(
        fenced("while True:\n    pass"),
        {"inputs": [""], "outputs": ["1"]},
        timeout_s=0.5,
        sandbox_fusion_url=service.url,
    )
    assert result["score"] == 0.0 and result["reason"] == "timeout"


def test_gateway_errors_are_retried(service, monkeypatch):
    monkeypatch.setattr(sandbox_fusion.time, "sleep", lambda s: None)  # the retries' 1 s and 2 s pauses
    service.fail_next = [503, 504]
    one = {"inputs": ["1\n"], "outputs": ["2"]}
    result = code_sandbox.compute_score(fenced("print(2)"), one, **FAST, sandbox_fusion_url=service.url)
    assert result["score"] == 1.0 and len(service.requests) == 3


@pytest.mark.parametrize(
    "fail,answer,message",
    [
        ([503, 503, 503], None, r"no answer after 3 attempt\(s\) \(HTTP 503"),
        ([400], None, r"no answer after 1 attempt\(s\) \(HTTP 400"),
        ([], {"status": "SandboxError", "message": "runner crashed"}, "status='SandboxError' runner crashed"),
    ],
)
def test_a_service_that_cannot_run_the_code_is_an_error_naming_it(service, monkeypatch, fail, answer, message):
    """Not a failed test: the sample would train on a zero reward while the service is down."""
    monkeypatch.setattr(sandbox_fusion.time, "sleep", lambda s: None)
    service.fail_next, service.answer_next = list(fail), [answer] if answer else []
    with pytest.raises(sandbox_fusion.SandboxServiceError, match=f"reward.sandbox_fusion.url={service.url}.*{message}"):
        sandbox_fusion.run_remote(service.url, "print(1)")


def test_an_unreachable_service_is_an_error_naming_it(monkeypatch):
    monkeypatch.setattr(sandbox_fusion.time, "sleep", lambda s: None)
    closed = StandIn()
    url = closed.url
    closed.close()  # nothing listens on the port now
    with pytest.raises(sandbox_fusion.SandboxServiceError, match=f"url={url}: no answer after 3 attempt"):
        sandbox_fusion.run_remote(url, "print(1)")


def test_max_concurrent_bounds_the_requests_in_flight():
    service = StandIn(delay_s=0.3)
    try:
        truth = {"inputs": [f"{i}\n" for i in range(6)], "outputs": [f"{2 * i}" for i in range(6)]}
        semaphore = sandbox_fusion.shared_semaphore(service.url, 2)
        assert sandbox_fusion.shared_semaphore(service.url, 2) is semaphore  # one per service in a process
        remote = dict(sandbox_fusion_url=service.url, concurrent_semaphore=semaphore)
        result = code_sandbox.compute_score(fenced("print(int(input()) * 2)"), truth, **FAST, **remote)
        assert result["score"] == 1.0 and service.most_in_flight == 2  # sent together, never more than 2
    finally:
        service.close()


def test_only_the_code_scorer_sends_code_to_the_service(service):
    bound = dict(sandbox_fusion_url=service.url, concurrent_semaphore=None, memory_limit_mb=300)
    assert default_compute_score("openai/gsm8k", "#### 4", "4", **bound) == 1.0
    assert service.requests == []
    result = default_compute_score("codecontests", fenced("print(int(input()) * 2)"), DOUBLE, **bound)
    assert result["score"] == 1.0 and len(service.requests) == 3 and service.requests[0]["memory_limit_MB"] == 300


TOK = build_tiny_tokenizer()


def code_batch(rows) -> DataProto:
    """rows: (response text, data_source, ground truth); one-token prompts, right-padded responses."""
    encoded = [TOK.encode(text, add_special_tokens=False) + [TOK.eos_token_id] for text, _, _ in rows]
    width = max(map(len, encoded))
    responses = torch.tensor([ids + [TOK.pad_token_id] * (width - len(ids)) for ids in encoded])
    mask = torch.tensor([[1] + [1] * len(ids) + [0] * (width - len(ids)) for ids in encoded])
    return DataProto.from_dict(
        tensors={"prompts": torch.ones(len(rows), 1, dtype=torch.long), "responses": responses, "attention_mask": mask},
        non_tensors={
            "data_source": np.array([source for _, source, _ in rows], dtype=object),
            "reward_model": np.array([{"ground_truth": truth} for _, _, truth in rows], dtype=object),
        },
    )


@pytest.mark.parametrize("manager", ["naive", "batch"])
def test_the_configured_service_scores_code_rows_through_the_reward_manager(service, manager):
    rows = [
        ("```python\nprint(int(input()) * 2)\n```", "codecontests", json.dumps(DOUBLE)),
        ("```python\nprint(int(input()) + 1)\n```", "apps", json.dumps(DOUBLE)),  # right for 1 only
        ("#### 4", "openai/gsm8k", "4"),
    ]
    reward = RewardConfig(
        num_workers=0,
        reward_manager=RewardManagerConfig(name=manager),
        sandbox_fusion=SandboxFusionConfig(url=service.url, max_concurrent=4, memory_limit_mb=512),
    )
    scores = RewardRecipe(reward, "data_source", TOK).build(num_examine=0)(code_batch(rows)).sum(-1)
    assert scores.tolist() == pytest.approx([1.0, 1 / 3, 1.0])
    assert len(service.requests) == 6 and {r["memory_limit_MB"] for r in service.requests} == {512}


def test_sandbox_scorer_binds_each_managers_own_default():
    config = SandboxFusionConfig(url="http://127.0.0.1:9/run_code", max_concurrent=3)
    for cls in (NaiveRewardManager, BatchRewardManager):
        bound = sandbox_scorer(cls, config)
        assert bound.func is cls.default_score and bound.keywords["sandbox_fusion_url"] == config.url
    with pytest.raises(ValueError, match="reward.sandbox_fusion.url=.*reward manager object has no built-in scorer"):
        sandbox_scorer(object, config)


def _ppo(tiny_model_dir, tiny_data_dir, tmp_path, *extra):
    from tests.trainer.e2e_helpers import base_overrides

    return load_config("ppo_trainer", [*base_overrides(tiny_model_dir, tiny_data_dir, tmp_path), *extra])


def test_the_keys_are_checked_at_start_up(tiny_model_dir, tiny_data_dir, tmp_path):
    with pytest.raises(ConfigError, match="reward.sandbox_fusion.url='localhost:8080' must be an http"):
        checked_config(_ppo(tiny_model_dir, tiny_data_dir, tmp_path, "reward.sandbox_fusion.url=localhost:8080"))
    with pytest.raises(ConfigError, match="reward.sandbox_fusion.max_concurrent=0 must be >= 1"):
        keys = ("reward.sandbox_fusion.url=http://h/run_code", "reward.sandbox_fusion.max_concurrent=0")
        checked_config(_ppo(tiny_model_dir, tiny_data_dir, tmp_path, *keys))


def test_a_custom_reward_function_leaves_the_service_unused(service, tmp_path):
    (tmp_path / "mine.py").write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.25\n"
    )
    reward = RewardConfig(
        num_workers=0,
        custom_reward_function=CustomRewardFunctionConfig(path=str(tmp_path / "mine.py"), name="score"),
        sandbox_fusion=SandboxFusionConfig(url=service.url),
    )
    assert any("reward.sandbox_fusion.url" in note and "not used" in note for note in reward.validate(False))
    rows = [("```python\nprint(2)\n```", "codecontests", json.dumps(DOUBLE))]
    scores = RewardRecipe(reward, "data_source", TOK).build(num_examine=0)(code_batch(rows)).sum(-1)
    assert scores.tolist() == [0.25] and service.requests == []


def _code_tool(config: dict):
    from hybridflow.tools.sandbox_fusion_tools import SandboxFusionTool
    from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema

    parameters = {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}
    function = {"name": "code_interpreter", "description": "run", "parameters": parameters}
    return SandboxFusionTool(
        config, OpenAIFunctionToolSchema.model_validate({"type": "function", "function": function})
    )


def test_the_sandbox_fusion_tool_runs_the_models_code_in_the_configured_service(service):
    import asyncio

    tool = _code_tool({"sandbox_fusion_url": service.url, "default_timeout": 3, "memory_limit_mb": 200})
    response, _, info = asyncio.run(tool.execute("i", {"code": "print(6 * 7)"}))
    assert response.text == "42\n" and info["reason"] == "ok"
    assert service.requests[0]["code"] == "print(6 * 7)" and service.requests[0]["memory_limit_MB"] == 200
    response, _, info = asyncio.run(tool.execute("i", {"code": "raise ValueError('nope')"}))
    assert info["reason"] == "error" and "ValueError: nope" in response.text  # the model sees its error
    # without a URL the same tool runs in the local sandbox: the service sees nothing more
    local = _code_tool({"default_timeout": 3})
    assert asyncio.run(local.execute("i", {"code": "print(1 + 1)"}))[0].text == "2\n" and len(service.requests) == 2
    with pytest.raises(ValueError, match="sandbox_fusion_url='localhost:1' is not an http"):
        _code_tool({"sandbox_fusion_url": "localhost:1"})


def test_the_service_settings_without_a_service_are_noted_by_name():
    notes = RewardConfig(sandbox_fusion=SandboxFusionConfig(memory_limit_mb=512)).validate(False)
    assert any(
        "reward.sandbox_fusion.memory_limit_mb=512: not used without reward.sandbox_fusion.url" in n for n in notes
    )
    assert not RewardConfig(sandbox_fusion=SandboxFusionConfig()).validate(False)
