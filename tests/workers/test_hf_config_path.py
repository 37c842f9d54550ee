"""veRL's ``model.hf_config_path``: the trained model is built from that folder's config.json, its weights still
from ``model.path`` (actor, reference policy, the hf rollout's copy, the critic; the SFT trainer). The test's
config differs from the model's in ``rope_theta`` (outputs change, shapes do not)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import build_trainer, checked_config
from hybridflow.main_sft import run_sft
from hybridflow.utils.environ import restored_environ
from tests.trainer.e2e_helpers import base_overrides
from tests.trainer.test_sft_trainer import sft_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture
def other_config(tiny_model_dir, tmp_path):
    folder = tmp_path / "config_only"
    folder.mkdir()
    shutil.copy(os.path.join(tiny_model_dir, "config.json"), folder / "config.json")
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = 1234.5  # also under rope_parameters in transformers 5's files
    if isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"]["rope_theta"] = 1234.5
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None)
    return float(params["rope_theta"] if isinstance(params, dict) and "rope_theta" in params else config.rope_theta)


def test_the_ppo_roles_are_built_from_hf_config_path(tiny_model_dir, tiny_data_dir, tmp_path, other_config):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="gae", steps=1, backend="inprocess")
    keys = [f"actor_rollout_ref.model.hf_config_path={other_config}", f"critic.model.hf_config_path={other_config}"]
    config = checked_config(load_config("ppo_trainer", [*overrides, *keys, "actor_rollout_ref.actor.use_kl_loss=True"]))
    with restored_environ(["HYBRIDFLOW_DEVICE"]):
        trainer = build_trainer(config)
        trainer.init_workers()
        try:
            policy = trainer.actor_rollout_wg.workers[0]._roles["actor_rollout"]
            critic = trainer.critic_wg.workers[0]._roles["critic"]
            modules = {
                "actor": policy.actor_engine.module,
                "ref": policy.ref_engine.module,
                "hf rollout": policy.rollout_host.server.module,
                "critic": critic.engine.module,
            }
            for role, module in modules.items():
                assert _rope_theta(module.config) == 1234.5, role
            weights = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
            name = next(n for n in weights if n.endswith("q_proj.weight"))
            assert torch.equal(dict(modules["actor"].named_parameters())[name].detach(), weights[name])  # path's
        finally:
            trainer.shutdown_workers()


def test_sft_is_built_from_hf_config_path_and_a_folder_without_config_is_named(
    tiny_model_dir, tiny_data_dir, tmp_path, other_config
):
    from transformers import AutoConfig

    def sft(out: str, config_path: str) -> str:
        overrides = sft_overrides(tiny_model_dir, tiny_data_dir, out, **{"model.hf_config_path": config_path})
        return run_sft(load_config("sft_trainer", overrides))

    final = sft(str(tmp_path / "out"), other_config)
    assert _rope_theta(AutoConfig.from_pretrained(final)) == 1234.5  # the trained model's config, saved
    with pytest.raises(FileNotFoundError, match="model.hf_config_path='/nowhere': no Hugging Face model directory"):
        sft(str(tmp_path / "x"), "/nowhere")
