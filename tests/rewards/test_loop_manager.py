"""veRL 0.9's reward-loop managers (``RewardManagerBase`` with ``async run_single``): a user's class, from a file
(``reward.reward_manager.source=importlib``) or registered by name, scores as veRL's reward loop would run it.

The manager file below is written the way veRL's own naive reward-loop manager is (decode on
``self.loop.run_in_executor``, the score and extra info in a dict), with hybridflow's import paths; its scores
are compared with hybridflow's NaiveRewardManager on the same batch, an independent implementation."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hybridflow.config.convert import as_section
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.config.module import ModuleConfig
from hybridflow.config.reward import RewardConfig, RewardManagerConfig
from hybridflow.main_ppo import checked_config
from hybridflow.rewards import NaiveRewardManager, RewardComputationError
from hybridflow.rewards.registry import REWARD_MANAGERS
from hybridflow.rewards.streaming import RewardRecipe
from tests.rewards.test_reward_manager import EOS, ROWS, TOK, make_batch

MANAGER = '''
from hybridflow.experimental.reward_loop.reward_manager.base import RewardManagerBase
from hybridflow.experimental.reward_loop.reward_manager import register


class MyLoopManager(RewardManagerBase):
    """veRL's naive reward-loop manager, as a user would copy it, plus a bonus read from the config."""

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.bonus = float(config.reward.reward_kwargs.get("bonus", 0.0))
        self.router = reward_router_address

    async def run_single(self, data):
        item = data[0]
        response = item.batch["responses"]
        valid = int(item.batch["attention_mask"][-response.shape[-1]:].sum())
        ids = response[:valid]
        text = await self.loop.run_in_executor(None, lambda: self.tokenizer.decode(ids, skip_special_tokens=True))
        source = item.non_tensor_batch["data_source"]
        if source == "boom":
            raise RuntimeError("this sample breaks the manager")
        if source == "slow":
            import asyncio
            await asyncio.sleep(30)
        result = await self.loop.run_in_executor(None, lambda: self.compute_score(
            data_source=source, solution_str=text, ground_truth=item.non_tensor_batch["reward_model"]["ground_truth"],
            extra_info=item.non_tensor_batch.get("extra_info", {})))
        score = result["score"] if isinstance(result, dict) else result
        return {"reward_score": score + self.bonus, "reward_extra_info": {"acc": score, "length": valid}}


@register("my_loop_manager")
class Registered(MyLoopManager):
    pass
'''


@pytest.fixture
def manager_file(tmp_path):
    path = tmp_path / "my_manager.py"
    path.write_text(MANAGER)
    yield str(path)
    if "my_loop_manager" in REWARD_MANAGERS:  # the file registers it when loaded
        del REWARD_MANAGERS["my_loop_manager"]


def _from_file(path, **reward) -> RewardRecipe:
    manager = RewardManagerConfig(source="importlib", name="MyLoopManager", module=ModuleConfig(path=path))
    return RewardRecipe(RewardConfig(num_workers=0, reward_manager=manager, **reward), "data_source", TOK)


def test_a_verl_loop_manager_from_a_file_scores_as_the_naive_manager(manager_file):
    batch = make_batch(ROWS)
    expected = NaiveRewardManager(TOK, num_examine=0)(batch, return_dict=True)
    out = _from_file(manager_file).build(num_examine=0)(make_batch(ROWS), return_dict=True)
    assert torch.equal(out["reward_tensor"], expected["reward_tensor"])  # same scores, same last-token positions
    assert out["reward_extra_info"]["acc"] == expected["reward_tensor"].sum(-1).tolist()
    assert out["reward_extra_info"]["length"] == [7, 10, 7, 10, 1]  # the manager's own field, per row


def test_the_manager_reads_the_config_and_is_registered_by_name(manager_file):
    _from_file(manager_file).manager_class()  # loading the file registers "my_loop_manager"
    reward = RewardConfig(
        num_workers=0, reward_manager=RewardManagerConfig(name="my_loop_manager"), reward_kwargs={"bonus": 0.5}
    )
    manager = RewardRecipe(reward, "data_source", TOK).build(num_examine=0)
    scores = manager(make_batch(ROWS)).sum(-1)
    assert scores.tolist() == [1.5, 1.5, 0.5, 1.5, 0.5]  # the rule scores plus config.reward.reward_kwargs.bonus
    assert manager.inner.router is None  # veRL's reward loop argument: no reward router here


def test_a_failing_or_slow_sample_is_named_or_scored_as_bad(manager_file):
    rows = [ROWS[0], ("Q", ROWS[0][1], "boom", "4")]
    with pytest.raises(RewardComputationError, match="sample 1 \\(data_source='boom'\\).*breaks the manager"):
        _from_file(manager_file).build(num_examine=0)(make_batch(rows))
    rows = [ROWS[0], ("Q", ROWS[0][1], "boom", "4"), ("Q", ROWS[0][1], "slow", "4")]
    recipe = _from_file(manager_file, bad_sample_score=-1.0, score_timeout_s=0.5)
    out = recipe.build(num_examine=0)(make_batch(rows), return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, -1.0, -1.0] and out["reward_metrics"] == {
        "reward/bad_samples": 2.0
    }


def test_the_manager_runs_inside_a_running_event_loop_and_row_by_row(manager_file):
    manager = _from_file(manager_file).build(num_examine=0)

    async def in_a_loop():
        return manager(make_batch(ROWS))

    assert asyncio.run(in_a_loop()).sum(-1).tolist() == [1.0, 1.0, 0.0, 1.0, 0.0]
    # the reward loop's call on one finished trajectory (reward.num_workers > 0)
    assert manager.score_rows(make_batch(ROWS[:1])) == [{"score": 1.0, "acc": 1.0, "length": 7}]


def test_source_importlib_is_checked_at_start_up(manager_file, tiny_model_dir, tiny_data_dir, tmp_path):
    from tests.trainer.e2e_helpers import base_overrides

    def config(*extra):
        return load_config("ppo_trainer", [*base_overrides(tiny_model_dir, tiny_data_dir, tmp_path), *extra])

    with pytest.raises(ConfigError, match="source=importlib needs reward.reward_manager.module.path"):
        checked_config(config("reward.reward_manager.source=importlib"))
    with pytest.raises(ConfigError, match=r"module.path=.*my_manager.py: ImportError: .*defines no 'Missing'"):
        checked_config(
            config(
                "reward.reward_manager.source=importlib",
                f"reward.reward_manager.module.path={manager_file}",
                "reward.reward_manager.name=Missing",
            )
        )
    checked_config(
        config(
            "reward.reward_manager.source=importlib",
            f"reward.reward_manager.module.path={manager_file}",
            "reward.reward_manager.name=MyLoopManager",
        )
    )


def test_the_reward_pool_scores_with_the_file_manager_in_its_own_processes(manager_file):
    """reward.num_workers > 0: the pool's host process loads the file from the recipe and scores each row."""
    from hybridflow.rewards.streaming import RewardPool

    pool = RewardPool(_from_file(manager_file), processes=1)
    try:
        assert pool.submit(make_batch(ROWS[:1])).result(timeout=120) == [{"score": 1.0, "acc": 1.0, "length": 7}]
        assert pool.submit(make_batch(ROWS[2:3])).result(timeout=120) == [{"score": 0.0, "acc": 0.0, "length": 7}]
    finally:
        pool.close()


JUDGES = '''
from hybridflow.rewards import NaiveRewardManager
from hybridflow.rewards.genrm import GenRMRewardManager


class genrm(NaiveRewardManager):
    """Named like the built-in judge manager, but scores by rule."""


class MyJudge(GenRMRewardManager):
    """A judge-scored manager of the user's, under a name the registry does not know."""
'''


def test_a_file_manager_is_a_judge_by_its_class_not_its_name(tmp_path):
    """With source=importlib the run has a judge when the file's class declares needs_judge (a
    GenRMRewardManager subclass), whatever the class is called."""
    from hybridflow.rewards.registry import manager_needs_judge

    path = tmp_path / "judges.py"
    path.write_text(JUDGES)

    def manager(name, source="importlib"):
        return RewardManagerConfig(source=source, name=name, module=ModuleConfig(path=str(path)))

    assert manager_needs_judge(manager("genrm", source="register"))  # the registry's genrm
    assert not manager_needs_judge(manager("genrm"))  # the file's genrm scores by rule
    assert manager_needs_judge(manager("MyJudge"))
    assert not manager_needs_judge(manager("Missing"))  # the start-up check names the file
    assert not manager_needs_judge(manager("nobody", source="register"))


def test_veRLs_gdpo_manager_passes_the_experiment_name_and_keeps_the_reward_components(tmp_path):
    # veRL 0.9's GDPO example: reward.reward_manager.name=gdpo with a scorer (rlla) that reads the experiment
    # name from extra_info and returns per-component rewards
    scorer = tmp_path / "components.py"
    scorer.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    if 'qwen' not in extra_info.get('experiment_name', ''):\n"
        "        raise NotImplementedError(f'Unknown model name: {extra_info.get(\"experiment_name\")!r}')\n"
        "    accuracy = float(solution_str.strip().endswith(ground_truth))\n"
        "    fmt = float('####' in solution_str)\n"
        "    return {'score': accuracy + fmt, 'accuracy_reward': accuracy, 'format_reward': fmt}\n"
    )
    reward = as_section(
        {
            "num_workers": 0,
            "reward_manager": {"name": "gdpo"},
            "custom_reward_function": {"path": str(scorer), "name": "compute_score"},
        },
        RewardConfig,
        "reward",
    )
    run = {"trainer": {"experiment_name": "qwen2.5_gdpo"}, "reward": {}}
    out = RewardRecipe(reward, "data_source", TOK, run_config=run).build(num_examine=0)(
        make_batch(ROWS), return_dict=True
    )
    texts = [TOK.decode(r[: r.index(EOS) + 1 if EOS in r else len(r)], skip_special_tokens=True) for _, r, _, _ in ROWS]
    truths = [truth for _, _, _, truth in ROWS]
    accuracy = [float(t.strip().endswith(g)) for t, g in zip(texts, truths)]
    fmt = [float("####" in t) for t in texts]
    assert out["reward_extra_info"]["accuracy_reward"] == accuracy and out["reward_extra_info"]["format_reward"] == fmt
    assert out["reward_tensor"].sum(-1).tolist() == [a + f for a, f in zip(accuracy, fmt)]
    with pytest.raises(RewardComputationError, match="Unknown model name: ''"):  # without the run's name
        RewardRecipe(reward, "data_source", TOK).build(num_examine=0)(make_batch(ROWS))
