"""PF-PPO (``algorithm.use_pf_ppo``): the batch the updates see is redrawn by sequence score."""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms.pf_ppo import pf_ppo_resample_indices, pf_ppo_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_weights_by_hand():
    scores = torch.tensor([-2.0, 0.0, 1.0, 3.0])
    torch.testing.assert_close(pf_ppo_weights(scores, "pow", 2.0), torch.tensor([4.0, 1e-8, 1.0, 9.0]) + 1e-8)
    torch.testing.assert_close(pf_ppo_weights(scores, "max_min", 2.0), torch.tensor([1.0, 0.0, 0.0, 1.0]) + 1e-8)
    torch.testing.assert_close(pf_ppo_weights(scores, "max_random", 2.0), torch.tensor([0.1, 0.1, 0.1, 0.4]) + 1e-8)
    with pytest.raises(ValueError, match="reweight_method='best'"):
        pf_ppo_weights(scores, "best", 2.0)


def test_draws_follow_the_weights():
    # pow 2 over scores 1 and 2: row "2" is drawn 4 times as often as row "1"; score 0 almost never
    scores = torch.tensor([0.0, 1.0, 2.0] * 4000)
    idx = pf_ppo_resample_indices(scores, "pow", 2.0, torch.Generator().manual_seed(0))
    assert len(idx) == len(scores)
    picked = scores[idx]
    ones, twos = int((picked == 1).sum()), int((picked == 2).sum())
    assert int((picked == 0).sum()) == 0 and 3.7 < twos / ones < 4.3
    again = pf_ppo_resample_indices(scores, "pow", 2.0, torch.Generator().manual_seed(0))
    assert torch.equal(idx, again)  # seeded: a rerun draws the same rows


def test_updates_see_only_the_best_and_worst_groups_with_max_min(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from hybridflow.trainer.ppo import ray_trainer
    from tests.trainer.e2e_helpers import base_overrides

    seen = []
    advantage, update = ray_trainer.RayPPOTrainer._compute_advantage, ray_trainer.RayPPOTrainer._update_actor

    def recording_advantage(trainer, batch):
        advantage(trainer, batch)
        seen.append(("generated", batch.batch["token_level_scores"].sum(-1).clone()))

    def recording_update(trainer, batch, metrics):
        seen.append(("updated", batch.batch["token_level_scores"].sum(-1).clone()))
        return update(trainer, batch, metrics)

    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_compute_advantage", recording_advantage)
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_update_actor", recording_update)
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, n=4, batch=4, steps=2, response_length=12, backend="inprocess"
    )
    run_ppo(
        load_config(
            "ppo_trainer",
            [
                *overrides,
                "trainer.test_freq=-1",
                "algorithm.use_pf_ppo=True",
                "algorithm.pf_ppo.reweight_method=max_min",
            ],
        )
    )
    assert [kind for kind, _ in seen] == ["generated", "updated"] * 2
    assert any(len(set(g.tolist())) > 2 for _, g in seen[::2])  # some step had middle scores to filter out
    for (_, generated), (_, updated) in zip(seen[::2], seen[1::2]):
        assert len(updated) == len(generated)
        extremes = {float(generated.max()), float(generated.min())}
        assert set(updated.tolist()) <= extremes  # every trained row is a best or a worst one
        if len(set(generated.tolist())) > 2:  # the key was not ignored: the middle scores were dropped
            assert set(updated.tolist()) != set(generated.tolist())
