"""DAPO's overlong penalty (``reward.reward_manager.name=dapo``, ``reward.reward_kwargs.overlong_buffer_cfg``)."""

import pytest
import torch

from hybridflow.rewards import NaiveRewardManager, load_reward_manager
from hybridflow.rewards.dapo import overlong_penalty
from tests.rewards.test_reward_manager import ROWS, TOK, expected_dense, make_batch


def test_overlong_penalty_by_hand():
    # max 20 tokens, the last 4 are the buffer: free up to 16, then -1/4 per token, -1 at 20 (factor 1)
    lengths = torch.tensor([10, 16, 17, 18, 20])
    assert overlong_penalty(lengths, 20, 4, 1.0).tolist() == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty(lengths, 20, 4, 0.5).tolist() == [0.0, 0.0, -0.125, -0.25, -0.5]


def test_dapo_adds_the_penalty_on_the_score_token_and_logs_it():
    cfg = {"enable": True, "len": 4, "penalty_factor": 1.0, "log": True}
    manager = load_reward_manager("dapo", TOK, num_examine=0, max_resp_len=10, overlong_buffer_cfg=cfg)
    out = manager(make_batch(ROWS), return_dict=True)
    # valid response lengths 7, 10, 7, 10, 1 against 10 - 4 = 6 free tokens
    penalty = [-0.25, -1.0, -0.25, -1.0, 0.0]
    last = [6, 9, 6, 9, 0]
    expected = expected_dense()
    for row, (p, pos) in enumerate(zip(penalty, last)):
        expected[row, pos] += p
    torch.testing.assert_close(out["reward_tensor"], expected)
    assert out["reward_extra_info"]["overlong_reward"] == penalty
    assert out["reward_extra_info"]["overlong"] == [True, True, True, True, False]


def test_dapo_without_the_buffer_is_the_naive_manager():
    dapo = load_reward_manager("dapo", TOK, num_examine=0, overlong_buffer_cfg={"enable": False, "len": 4})
    naive = NaiveRewardManager(TOK, num_examine=0)
    batch = make_batch(ROWS)
    torch.testing.assert_close(dapo(batch), naive(batch))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"overlong_buffer_cfg": {"enable": True, "len": 4}}, "needs reward.reward_kwargs.max_resp_len"),
        (
            {"max_resp_len": 10, "overlong_buffer_cfg": {"enable": True, "len": 0}},
            "overlong_buffer_cfg.len=0 must be > 0",
        ),
        ({"max_resp_len": 3, "overlong_buffer_cfg": {"enable": True, "len": 4}}, "max_resp_len=3 must be at least"),
    ],
)
def test_bad_buffer_settings_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_reward_manager("dapo", TOK, num_examine=0, **kwargs)


def test_main_ppo_passes_verl_reward_kwargs_to_the_manager(tiny_model_dir, tiny_data_dir, tmp_path):
    """veRL's DAPO script spelling (reward_model.* aliases, + for keys the yaml lacks) reaches the manager."""
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import build_reward_fns
    from tests.trainer.e2e_helpers import base_overrides

    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess")
    overrides = [o for o in overrides if not o.startswith("custom_reward_function")]
    config = load_config(
        "ppo_trainer",
        overrides
        + [
            "reward_model.reward_manager=dapo",
            "+reward_model.reward_kwargs.max_resp_len=10",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
            "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
        ],
    )
    reward_fn, val_reward_fn = build_reward_fns(config, TOK)
    for fn in (reward_fn, val_reward_fn):
        assert type(fn).__name__ == "DAPORewardManager" and fn.overlong
        assert (fn.max_resp_len, fn.buffer_len, fn.penalty_factor) == (10, 4, 0.5)
