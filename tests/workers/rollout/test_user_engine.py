"""A rollout engine of the user's (an AsyncRolloutServer) selected by ``actor_rollout_ref.rollout.name``: by
its class (``file.py:Class`` or ``package.module.Class``, imported where the engine runs) or by a name
registered in the process (``register_rollout_server``). Before, ``rollout.name`` took hf or vllm only, so
the registry the server interface offers could not be reached from a config."""

from __future__ import annotations

import pytest

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.config.rollout import REGISTERED_ENGINES
from hybridflow.rollout import ROLLOUT_SERVERS, register_rollout_server, rollout_server_class
from hybridflow.workers.rollout.hf_server import HFServer

ENGINE = """
from hybridflow.rollout.server import AsyncRolloutServer
from hybridflow.workers.rollout.hf_server import HFServer


class CountingServer(HFServer):
    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        with open({log!r}, "a") as f:
            f.write(request_id + "\\n")
        return await super().generate(prompt_ids, params, request_id, logprobs)


class NotAServer:
    pass


class GenerateOnly(HFServer):
    score = AsyncRolloutServer.score  # as an engine that only generates: no score()


class CountingScorer(HFServer):
    async def score(self, sequences, topk):
        with open({log!r}, "a") as f:
            f.write("score %d\\n" % len(sequences))
        return await super().score(sequences, topk)
"""


@pytest.fixture
def engine_file(tmp_path):
    log = tmp_path / "requests.log"
    path = tmp_path / "my_engine.py"
    path.write_text(ENGINE.format(log=str(log)))
    return str(path), log


def test_a_training_run_generates_with_the_users_engine(engine_file, tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.main_ppo import run_ppo
    from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

    path, log = engine_file
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, n=2, batch=4, steps=1, backend="inprocess")
    no_validation = ["trainer.val_before_train=False", "trainer.test_freq=-1"]
    run_ppo(
        load_config(
            "ppo_trainer", [*overrides, *no_validation, f"actor_rollout_ref.rollout.name={path}:CountingServer"]
        )
    )
    (step,) = read_metrics(tmp_path)
    assert_finite(step)
    assert len(log.read_text().split()) == 4 * 2  # every sample of the step came from it


def test_the_class_is_checked_by_key_when_the_run_starts(engine_file, tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.main_ppo import checked_config
    from tests.trainer.e2e_helpers import base_overrides

    path, _ = engine_file
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess")
    for name, why in (
        (f"{path}:NotAServer", "is not an AsyncRolloutServer subclass"),
        (f"{path}:Missing", "defines no 'Missing'"),
    ):
        with pytest.raises(ConfigError, match=f"actor_rollout_ref.rollout.name={name}: .*{why}"):
            checked_config(load_config("ppo_trainer", [*overrides, f"actor_rollout_ref.rollout.name={name}"]))
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.name='sglang' is not supported by hybridflow"):
        load_config("ppo_trainer", ["actor_rollout_ref.rollout.name=sglang"])


def test_a_name_registered_in_the_process_is_accepted():
    @register_rollout_server("counting_test_engine")
    class Registered(HFServer):
        pass

    try:
        config = load_config("ppo_trainer", ["actor_rollout_ref.rollout.name=counting_test_engine"])
        assert config.actor_rollout_ref.rollout.name == "counting_test_engine"
        assert rollout_server_class("counting_test_engine") is Registered
        assert rollout_server_class("hf") is HFServer
    finally:
        del ROLLOUT_SERVERS["counting_test_engine"]
        REGISTERED_ENGINES.discard("counting_test_engine")
    with pytest.raises(KeyError, match="counting_test_engine"):
        rollout_server_class("counting_test_engine")


def test_a_generative_reward_model_is_served_by_the_users_engine(engine_file, tiny_model_dir, tiny_data_dir, tmp_path):
    """reward.reward_model.rollout.name takes an engine of the user's as rollout.name does (before: hf or vllm)."""
    from hybridflow.main_ppo import checked_config, run_ppo
    from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics
    from tests.trainer.test_genrm_e2e import genrm_overrides

    path, log = engine_file
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, n=2, batch=4, steps=1, backend="inprocess")
    overrides += ["trainer.val_before_train=False", "trainer.test_freq=-1"]
    overrides += genrm_overrides(tiny_model_dir, f"{path}:CountingServer")  # the judge; the policy keeps hf
    run_ppo(load_config("ppo_trainer", overrides))
    (step,) = read_metrics(tmp_path)
    assert_finite(step)
    assert len(log.read_text().split()) == 4 * 2  # one judge request per sample of the step
    bad = genrm_overrides(tiny_model_dir, f"{path}:NotAServer")
    with pytest.raises(ConfigError, match=f"reward.reward_model.rollout.name={path}:NotAServer: .*not an AsyncRollout"):
        checked_config(load_config("ppo_trainer", [*overrides, *bad]))
    with pytest.raises(ConfigError, match="reward.reward_model.rollout.name='sglang' is not supported by hybridflow"):
        load_config("ppo_trainer", [*overrides, "reward.reward_model.rollout.name=sglang"])


def test_a_distillation_teacher_scores_on_the_users_engine(engine_file, tiny_model_dir, tiny_data_dir, tmp_path):
    """distillation.teacher_models.*.inference.name takes an engine of the user's that implements score()."""
    from hybridflow.main_ppo import checked_config, run_ppo
    from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

    path, log = engine_file
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, n=2, batch=4, steps=1, backend="inprocess")
    overrides += ["trainer.val_before_train=False", "trainer.test_freq=-1"]
    teacher = "distillation.teacher_models.teacher_model"
    distil = [
        "distillation.enabled=True",
        f"{teacher}.model_path={tiny_model_dir}",
        f"{teacher}.inference.dtype=float32",
        "distillation.distillation_loss.loss_mode=forward_kl_topk",
        "distillation.distillation_loss.topk=4",
    ]
    run_ppo(load_config("ppo_trainer", [*overrides, *distil, f"{teacher}.inference.name={path}:CountingScorer"]))
    (step,) = read_metrics(tmp_path)
    assert_finite(step)
    assert "distillation/kl" in step
    scored = [line.split() for line in log.read_text().splitlines()]
    assert scored and all(word == "score" for word, _ in scored)  # the teacher's scores came from it
    assert sum(int(n) for _, n in scored) == 4 * 2  # every sample of the step
    bad = f"{teacher}.inference.name={path}:GenerateOnly"
    with pytest.raises(ConfigError, match=f"{teacher}.inference.name={path}:GenerateOnly: .*does not implement score"):
        checked_config(load_config("ppo_trainer", [*overrides, *distil, bad]))
