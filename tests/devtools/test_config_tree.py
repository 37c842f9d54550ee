"""veRL's config tree at hybridflow/trainer/config/: generated from configs/ppo_trainer.yaml, current,
and composed by Hydra (the way veRL example configs extend ``ppo_trainer`` through the search path)
into exactly configs/ppo_trainer.yaml."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from devtools import config_tree
from hybridflow.config.loader import load_config, raw_default_config

REPO = Path(__file__).resolve().parents[2]

# a veRL example (examples/sglang_multiturn/config/gsm8k_multiturn_grpo.yaml's shape), its search path
# moved from verl/ to hybridflow/
EXAMPLE = textwrap.dedent("""
    hydra:
      searchpath:
        - {searchpath}

    defaults:
      - ppo_trainer
      - _self_

    data:
      max_prompt_length: 768
      max_response_length: 1024
      train_batch_size: 128
      return_raw_chat: True

    actor_rollout_ref:
      hybrid_engine: True
      actor:
        optim:
          lr: 3.0e-6
      rollout:
        name: vllm
        multi_turn:
          enable: True
          max_assistant_turns: 4
""")


def hydra_compose(config_dir: Path, name: str):
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=name)


def test_the_committed_tree_is_what_the_generator_writes():
    stale = [
        name
        for name, text in config_tree.render().items()
        if not (config_tree.TREE_DIR / name).is_file() or (config_tree.TREE_DIR / name).read_text() != text
    ]
    assert stale == [], "run python -m devtools.config_tree"
    assert config_tree.main(["--check"]) == 0


def test_the_files_have_verls_names_and_defaults():
    dp_actor = yaml.safe_load((config_tree.TREE_DIR / "actor/dp_actor.yaml").read_text())
    assert dp_actor["defaults"] == [{"../optim@optim": "fsdp"}, {"../engine@fsdp_config": "fsdp"}, "actor", "_self_"]
    assert dp_actor["_target_"] == "verl.workers.config.FSDPActorConfig"
    assert (
        yaml.safe_load((config_tree.TREE_DIR / "actor/actor.yaml").read_text())["_target_"]
        == "verl.workers.config.ActorConfig"
    )
    dp_ref = yaml.safe_load((config_tree.TREE_DIR / "ref/dp_ref.yaml").read_text())
    assert dp_ref["fsdp_config"]["forward_only"] is True  # what makes the ref's engine differ from the shared one
    root = yaml.safe_load((config_tree.TREE_DIR / "ppo_trainer.yaml").read_text())
    assert {"actor@actor_rollout_ref.actor": "${model_engine}_actor"} in root["defaults"]
    assert "rollout/rollout.yaml" in config_tree.render() and "critic/dp_critic.yaml" in config_tree.render()


def test_hydra_composes_the_tree_into_configs_ppo_trainer():
    composed = hydra_compose(config_tree.TREE_DIR, "ppo_trainer")
    assert OmegaConf.to_container(composed, resolve=False) == raw_default_config("ppo_trainer")


# pkg://hybridflow.trainer.config is composed from an installed wheel in tests/test_packaging.py
@pytest.mark.parametrize("searchpath", ["file://hybridflow/trainer/config"])
def test_a_verl_example_config_composes_through_the_search_path(tmp_path, monkeypatch, searchpath):
    monkeypatch.chdir(REPO)  # file:// is relative to the working directory, as in veRL's examples
    (tmp_path / "gsm8k_multiturn_grpo.yaml").write_text(EXAMPLE.format(searchpath=searchpath))
    composed = OmegaConf.to_container(hydra_compose(tmp_path, "gsm8k_multiturn_grpo"), resolve=False)
    own = yaml.safe_load(EXAMPLE.format(searchpath=searchpath))
    del own["hydra"], own["defaults"]
    expected = OmegaConf.to_container(OmegaConf.merge(raw_default_config("ppo_trainer"), own))
    assert composed == expected
    assert composed["actor_rollout_ref"]["actor"]["optim"]["lr"] == 3.0e-6
    assert composed["critic"]["optim"]["lr"] == 1.0e-5  # the rest is ppo_trainer's

    # hybridflow's main_ppo reads the same file (--config-path/--config-name) into the same values
    cfg = load_config("gsm8k_multiturn_grpo", [], config_path=tmp_path, kind="ppo_trainer", notes=[])
    resolved = OmegaConf.to_container(OmegaConf.create(composed), resolve=True)
    assert cfg.data.train_batch_size == resolved["data"]["train_batch_size"] == 128
    assert (
        cfg.actor_rollout_ref.rollout.prompt_length == resolved["actor_rollout_ref"]["rollout"]["prompt_length"] == 768
    )
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 4
    assert set(OmegaConf.to_container(cfg)) == set(resolved)


def test_the_generator_refuses_parts_that_would_not_compose_back():
    tree = copy.deepcopy(raw_default_config("ppo_trainer"))
    # engine/fsdp.yaml is read from critic.fsdp: the actor's engine section cannot lose a key by merging
    del tree["actor_rollout_ref"]["actor"]["fsdp_config"]["seed"]
    with pytest.raises(config_tree.TreeError, match="'seed'"):
        config_tree.build(tree)
