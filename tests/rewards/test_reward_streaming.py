"""Rewards that overlap generation (``reward.num_workers``): the agent loop worker scores each trajectory
in a pool process as it finishes, and the driver's manager, given those results, returns what it returns
when it scores the whole batch itself: the same token-level scores, extra info and metrics, for the rule
scorers, a custom reward function (bad samples and deadlines included), DAPO and the code sandbox."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

from hybridflow.agent_loop import agent_loop_settings
from hybridflow.agent_loop.worker import AgentLoopWorker
from hybridflow.config.reward import CustomRewardFunctionConfig, RewardConfig, RewardManagerConfig
from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rewards import NaiveRewardManager, RewardComputationError
from hybridflow.rewards.rule_manager import STREAMED_SCORES
from hybridflow.rewards.streaming import RewardPool, RewardRecipe, streamed_reward
from hybridflow.rollout.server import STOP, TokenOutput

TOK = build_tiny_tokenizer()
EOS = TOK.eos_token_id
CODE = "```python\nprint(int(input())+1)\n```"
CUSTOM = """
import time

def score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if "raise" in solution_str:
        raise ValueError("cannot read " + solution_str)
    if "slow" in solution_str:
        time.sleep(3)
    return {"score": float(ground_truth in solution_str), "acc": ground_truth in solution_str,
            "turns": extra_info["num_turns"], "split": extra_info["split"]}
"""


def rows(kind: str) -> list[tuple[str, str, str]]:
    """(response, data_source, ground_truth) per trajectory."""
    if kind == "code":
        spec = '{"inputs": ["1\\n"], "outputs": ["2\\n"]}'
        return [(CODE, "codecontests", spec), ("print(3)", "apps", spec)] * 2
    if kind == "custom":
        return [("#### 4", "mine", "4"), ("raise", "mine", "4"), ("slow", "mine", "4"), ("nope", "mine", "7")]
    return [("#### 4", "openai/gsm8k", "4"), ("#### 3", "openai/gsm8k", "4"), ("\\boxed{2}", "lighteval/MATH", "2")]


class ScriptedServer:
    """Answers row i's prompt ``[i + 1]`` with its scripted response, the later rows first."""

    def __init__(self, responses: list[str]):
        self.responses, self.finished = responses, []

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        i = prompt_ids[-1] - 1
        await asyncio.sleep(0.05 * (len(self.responses) - i))
        toks = TOK.encode(self.responses[i], add_special_tokens=False)[: params.response_length - 1] + [EOS]
        self.finished.append(time.time())
        return TokenOutput(toks, [-0.5] * len(toks), STOP)


def generated(kind: str, recipe: RewardRecipe | None) -> DataProto:
    """The batch as the trainer scores it: prompts' columns and the agent loop worker's output."""
    table = rows(kind)
    settings = agent_loop_settings({"prompt_length": 2, "response_length": 48, "calculate_log_probs": True})
    worker = AgentLoopWorker(settings, [ScriptedServer([r for r, _, _ in table])], TOK, TOK.pad_token_id, reward=recipe)
    n = len(table)
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([[0, i + 1] for i in range(n)]),
            "attention_mask": torch.tensor([[0, 1]] * n),
            "position_ids": torch.tensor([[0, 0]] * n),
        },
        non_tensors={
            "data_source": np.array([s for _, s, _ in table], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": g} for _, _, g in table], dtype=object),
            "extra_info": np.array([{"split": "train", "index": i} for i in range(n)], dtype=object),
        },
    )

    try:
        if worker.reward_pool is not None:  # rows that finish while the pool starts are the driver's to score
            worker.reward_pool.start()
            assert worker.reward_pool.wait_ready(120)
        out = asyncio.run(worker.generate_sequences(prompts))
    finally:
        asyncio.run(worker.close_rewards())
    return DataProto(batch=out.batch, non_tensor_batch={**prompts.non_tensor_batch, **out.non_tensor_batch})


def recipe_for(kind: str, tmp_path, bad_sample_score=-1.0) -> RewardRecipe:
    custom = CustomRewardFunctionConfig(path=None)
    if kind == "custom":
        (tmp_path / "mine.py").write_text(CUSTOM)
        custom = CustomRewardFunctionConfig(path=str(tmp_path / "mine.py"), name="score")
    overlong = {"enable": True, "len": 4, "penalty_factor": 0.5, "log": True}
    reward = RewardConfig(
        num_workers=2,
        reward_manager=RewardManagerConfig(name=kind if kind in ("dapo", "remote") else "naive"),
        reward_kwargs={"max_resp_len": 8, "overlong_buffer_cfg": overlong} if kind == "dapo" else {},
        custom_reward_function=custom,
        bad_sample_score=bad_sample_score,
        score_timeout_s=1.0 if kind == "custom" else 60.0,
    )
    return RewardRecipe(reward, "data_source", TOK)


def recipe_scoring_with(tmp_path, source: str, num_workers: int) -> RewardRecipe:
    """A recipe whose reward function is ``score`` in a file holding ``source``."""
    (tmp_path / "scoring.py").write_text(source)
    custom = CustomRewardFunctionConfig(path=str(tmp_path / "scoring.py"), name="score")
    return RewardRecipe(RewardConfig(num_workers=num_workers, custom_reward_function=custom), "data_source", TOK)


def as_batch(data: DataProto) -> DataProto:
    """The same rows without the streamed results: what the driver scores after generation."""
    return DataProto(
        batch=data.batch.clone(),
        non_tensor_batch={k: v for k, v in data.non_tensor_batch.items() if k != STREAMED_SCORES},
    )


@pytest.mark.parametrize("kind", ["rule", "custom", "dapo", "code", "remote"])  # remote: veRL 0.9's name
def test_streamed_scores_equal_batch_scores(kind, tmp_path):
    recipe = recipe_for(kind, tmp_path)
    manager = recipe.build(num_examine=0)
    assert streamed_reward(manager, use_rm=False) is recipe
    data = generated(kind, recipe)
    streamed = data.non_tensor_batch[STREAMED_SCORES]
    assert all(s is not None for s in streamed)  # every trajectory was scored as it finished ...
    by_batch = manager(as_batch(data), return_dict=True)
    manager.compute_score = None  # ... so the driver does not call the reward function again
    by_stream = manager(data, return_dict=True)
    assert STREAMED_SCORES not in data.non_tensor_batch  # consumed: nothing downstream sees it
    assert torch.equal(by_stream["reward_tensor"], by_batch["reward_tensor"])
    assert by_stream["reward_extra_info"] == by_batch["reward_extra_info"]
    assert by_stream.get("reward_metrics") == by_batch.get("reward_metrics")
    scores = by_batch["reward_tensor"].sum(-1).tolist()
    expected = {
        "rule": [1.0, 0.0, 1.0],
        "remote": [1.0, 0.0, 1.0],
        "custom": [1.0, -1.0, -1.0, 0.0],  # raised, past the 1 s deadline: bad samples
        "code": [1.0, 0.0, 1.0, 0.0],
    }.get(kind)
    if kind == "dapo":  # "#### 4" + EOS is 7 tokens: 3 into the buffer that starts at 8 - 4
        assert scores == pytest.approx([1.0 - 0.375, -0.375, 1.0 - 0.75])  # \\boxed{2} + EOS: 10 tokens
        assert by_batch["reward_extra_info"]["overlong"] == [True] * 3
    else:
        assert scores == expected
    if kind == "custom":
        assert by_batch["reward_metrics"] == {"reward/bad_samples": 2.0}
        assert by_batch["reward_extra_info"]["turns"] == [2, None, None, 2]


def test_the_driver_decodes_only_the_rows_it_scores(tmp_path):
    """Rows the pool scored are not decoded again on the driver; rows left to it are, once each."""
    recipe = recipe_for("rule", tmp_path)
    manager = recipe.build(num_examine=0)
    data = generated("rule", recipe)
    decoded = []
    decode = manager.tokenizer.decode
    manager.tokenizer = type(
        "Counting", (), {"decode": lambda self, ids, **kw: decoded.append(1) or decode(ids, **kw)}
    )()
    data.non_tensor_batch[STREAMED_SCORES][1] = None  # the pool failed on row 1: the driver scores it
    scores = manager(data).sum(-1).tolist()
    assert scores == [1.0, 0.0, 1.0] and len(decoded) == 1


def test_a_failing_streamed_row_fails_the_step_naming_it(tmp_path):
    """Without reward.bad_sample_score the streamed failure raises as the batch's does: the same row, the same words."""
    recipe = recipe_for("custom", tmp_path, bad_sample_score=None)
    manager = recipe.build(num_examine=0)
    data = generated("custom", recipe)
    with pytest.raises(RewardComputationError) as from_batch:
        manager(as_batch(data))
    with pytest.raises(RewardComputationError) as from_stream:
        manager(data)
    assert str(from_stream.value) == str(from_batch.value)
    assert "sample 1 (data_source='mine')" in str(from_batch.value)


def test_scores_overlap_generation(tmp_path):
    """Trajectories finish 50 ms apart over 1 s; each is scored in a pool process while the later ones
    still generate."""
    recipe = recipe_scoring_with(
        tmp_path,
        "import os, time\n"
        "def score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    time.sleep(0.05)\n"
        "    return {'score': 1.0, 'pid': os.getpid(), 'at': time.time()}\n",
        num_workers=4,
    )
    n = 20
    server = ScriptedServer(["x"] * n)
    settings = agent_loop_settings({"prompt_length": 2, "response_length": 4, "agent": {"num_workers": 2}})
    worker = AgentLoopWorker(settings, [server], TOK, TOK.pad_token_id, reward=recipe)
    assert worker.reward_pool.processes == 2  # its share of reward.num_workers=4 over 2 agent loop workers
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[0, i + 1] for i in range(n)]), "attention_mask": torch.ones(n, 2)},
        non_tensors={
            "data_source": np.array(["mine"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": "1"}] * n, dtype=object),
        },
    )

    try:
        worker.reward_pool.start()  # as on a run's later steps: the pool has started
        assert worker.reward_pool.wait_ready(120)
        out = asyncio.run(worker.generate_sequences(prompts))
    finally:
        asyncio.run(worker.close_rewards())
    results = [s[0] for s in out.non_tensor_batch[STREAMED_SCORES]]
    assert len({r["pid"] for r in results}) == 2 and os.getpid() not in {r["pid"] for r in results}
    assert min(r["at"] for r in results) < max(server.finished)  # scored before the batch was generated


def test_which_runs_score_in_the_reward_loop():
    """Row-by-row managers built from the config stream; the batch manager, the judge, a reward model,
    ``reward.num_workers=0`` and a reward function handed over by hand score after generation."""
    built = lambda **kw: RewardRecipe(RewardConfig(**kw), "data_source", TOK).build(num_examine=0)  # noqa: E731
    assert streamed_reward(built(), use_rm=False) is not None
    assert streamed_reward(built(reward_manager=RewardManagerConfig(name="dapo")), use_rm=False) is not None
    assert streamed_reward(built(), use_rm=True) is None
    assert streamed_reward(built(num_workers=0), use_rm=False) is None
    assert streamed_reward(built(reward_manager=RewardManagerConfig(name="batch")), use_rm=False) is None
    assert streamed_reward(built(reward_manager=RewardManagerConfig(name="genrm")), use_rm=False) is None
    assert streamed_reward(NaiveRewardManager(TOK, num_examine=0), use_rm=False) is None
    with pytest.raises(ValueError, match="reward.num_workers=-1 must be >= 0"):
        built(num_workers=-1)


def test_close_kills_a_pool_process_that_cannot_take_its_stop_sentinel(tmp_path):
    """A process that never reads its stop sentinel (here: stopped; in a CI run: waiting on the call queue's lock
    that a killed sibling held) kept the interpreter's exit waiting on it; close() kills it."""

    settings = agent_loop_settings({"prompt_length": 2, "response_length": 48, "calculate_log_probs": True})
    worker = AgentLoopWorker(
        settings, [ScriptedServer(["#### 4"])], TOK, TOK.pad_token_id, reward=recipe_for("rule", tmp_path)
    )
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([[0, 1]]),
            "attention_mask": torch.tensor([[0, 1]]),
            "position_ids": torch.tensor([[0, 0]]),
        },
        non_tensors={
            "data_source": np.array(["openai/gsm8k"], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": "4"}], dtype=object),
            "extra_info": np.array([{"split": "train", "index": 0}], dtype=object),
        },
    )
    worker.reward_pool.start()
    assert worker.reward_pool.wait_ready(120)
    out = asyncio.run(worker.generate_sequences(prompts))
    assert out.non_tensor_batch[STREAMED_SCORES][0] is not None  # scored in the pool
    pids = scoring_processes(worker.reward_pool.host_pid) + [worker.reward_pool.host_pid]
    assert len(pids) >= 2  # the host and its processes
    try:
        os.kill(pids[0], signal.SIGSTOP)
        asyncio.run(worker.close_rewards())
        deadline = time.monotonic() + 10
        while any(map(running, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(running, pids)), [open(f"/proc/{pid}/stat").read() for pid in pids if running(pid)]
    finally:
        for pid in filter(running, pids):
            os.kill(pid, signal.SIGKILL)


def scoring_processes(host: int) -> list[int]:
    """The processes the pool's host forked."""
    with open(f"/proc/{host}/task/{host}/children") as children:
        return [int(pid) for pid in children.read().split()]


def running(pid: int) -> bool:
    """The process exists and is not a zombie (its parent may reap it any time)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_process_whose_starting_thread_has_ended_ends_too():
    """The death signal is not sent for a thread that ended before the child asked for it: the child checks."""
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from hybridflow.rewards.pool_host import _install

    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    fork = multiprocessing.get_context("fork")
    for forker, expected in ((threading.get_native_id(), 3), (ended.native_id, BrokenProcessPool)):
        pool = ProcessPoolExecutor(1, fork, initializer=_install, initargs=(None, forker))
        try:
            if expected is BrokenProcessPool:
                with pytest.raises(BrokenProcessPool):
                    pool.submit(abs, -3).result(timeout=30)
            else:
                assert pool.submit(abs, -3).result(timeout=30) == expected
        finally:
            pool.shutdown(wait=True)


class UnsafeAfterFork:
    """Dies in a forked copy of this process when freed there, as torch's DTensor sharding cache did when it
    held the last reference to a gloo process group (its destructor joins threads the copy does not have)."""

    def __init__(self):
        self.pid = os.getpid()

    def __del__(self):
        if os.getpid() != self.pid:
            os.kill(os.getpid(), signal.SIGKILL)


def test_scoring_survives_thread_state_that_a_fork_cannot_free(tmp_path):
    """Another thread holds, in its thread-local state, what a fork's copy cannot free (the copy frees every
    other thread's state after the fork). The pool's processes are not forks of this process: every row is
    scored in the pool (forked from here, each process died at birth and the driver scored the rows)."""
    local, held, release = threading.local(), threading.Event(), threading.Event()

    def hold():
        local.value = UnsafeAfterFork()
        held.set()
        release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait()
        data = generated("rule", recipe_for("rule", tmp_path))
    finally:
        release.set()
        holder.join()
    assert all(s is not None for s in data.non_tensor_batch[STREAMED_SCORES])


def test_a_dead_host_fails_what_waits_and_the_next_row_starts_a_new_one(tmp_path):
    """The host killed (an OOM kill): the rows waiting on it fail as a broken pool, its processes end with it,
    and after ``close`` (what the agent loop worker does on a broken pool) the next row is scored by a new host."""
    from concurrent.futures.process import BrokenProcessPool

    recipe = recipe_for("rule", tmp_path)
    pool = RewardPool(recipe, processes=1)
    row = generated("rule", None)[:1]
    expected = recipe.build(num_examine=0).score_rows(row)
    try:
        assert pool.submit(row).result(timeout=60) == expected
        host = pool.host_pid
        children = scoring_processes(host)
        os.kill(host, signal.SIGKILL)
        with pytest.raises(BrokenProcessPool, match=f"reward host process {host} ended"):
            pool.submit(row).result(timeout=60)
        deadline = time.monotonic() + 10
        while any(map(running, children)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children and not any(map(running, children))
        pool.close()
        assert pool.submit(row).result(timeout=60) == expected and pool.host_pid not in (None, host)
    finally:
        pool.close()


def test_rows_that_finish_while_the_pool_starts_are_left_to_the_driver(tmp_path):
    """The first call starts the pool's host (an interpreter that imports torch: seconds); the trajectories that
    finish before it is ready are not held back for it: they come back unscored, for the driver's manager."""
    recipe = recipe_for("rule", tmp_path)
    settings = agent_loop_settings({"prompt_length": 2, "response_length": 48, "calculate_log_probs": True})
    worker = AgentLoopWorker(settings, [ScriptedServer(["#### 4"])], TOK, TOK.pad_token_id, reward=recipe)
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.tensor([[0, 1]]), "attention_mask": torch.tensor([[0, 1]])},
        non_tensors={
            "data_source": np.array(["openai/gsm8k"], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": "4"}], dtype=object),
        },
    )
    try:
        cold = asyncio.run(worker.generate_sequences(prompts))  # 50 ms of generation
        started = worker.reward_pool.host_pid
        assert worker.reward_pool.wait_ready(120)
        warm = asyncio.run(worker.generate_sequences(prompts))
    finally:
        asyncio.run(worker.close_rewards())
    assert cold.non_tensor_batch[STREAMED_SCORES][0] is None  # the host was still importing
    assert warm.non_tensor_batch[STREAMED_SCORES][0] is not None and started is not None


def test_an_answer_this_process_cannot_unpickle_fails_its_row_only(tmp_path):
    """The reward function returns an object of a class from its own file, which only the host has loaded:
    that row fails (naming why), and the pool goes on answering (its reader did not die with the row)."""
    recipe = recipe_scoring_with(
        tmp_path,
        "class Tag:\n"
        "    pass\n\n"
        "def score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    return {'score': 1.0, 'tag': Tag()}\n",
        num_workers=1,
    )
    pool = RewardPool(recipe, processes=1)
    row = generated("custom", None)[:1]
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="answer cannot be read here"):
                pool.submit(row).result(timeout=60)
    finally:
        pool.close()


def test_the_remote_manager_needs_scoring_processes():
    from hybridflow.config.errors import ConfigError

    reward = RewardConfig(num_workers=0, reward_manager=RewardManagerConfig(name="remote"))
    with pytest.raises(ConfigError, match="reward.reward_manager.name=remote scores in reward.num_workers processes"):
        reward.validate(judge_scored=False)
    assert RewardConfig(num_workers=2, reward_manager=RewardManagerConfig(name="remote")).validate(False) == []
