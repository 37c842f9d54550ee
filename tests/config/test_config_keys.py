"""Every key of veRL's trees is in our yaml, every yaml key has a status, differing defaults are
documented, and the status table (docs/config_keys.md) is current. Then the behaviour of the
statuses: refusals name the key, legacy spellings map onto the canonical key, notes are printed."""

import dataclasses
from pathlib import Path

import pytest
from yaml_comments import key_comments

from devtools import config_table
from hybridflow.config import keys as config_keys
from hybridflow.config.keys import TABLES
from hybridflow.config.loader import ConfigError, config_dir, default_config, load_config, raw_default_config
from hybridflow.config.support import HONOURED, NOT_SUPPORTED, KeyTable
from hybridflow.utils.nested_dict import leaf_items

NAMES = list(TABLES)


def _leaves(name):
    """{key: resolved default} for every leaf of the yaml as written (a key whose value is an
    interpolation of a whole section is one leaf)."""
    resolved = default_config(name)

    def lookup(key):
        node = resolved
        for part in key.split("."):
            node = node[part]
        return node

    return {key: lookup(key) for key, _ in leaf_items(raw_default_config(name))}


def _paths(name):
    """Every dotted path of the yaml tree, inner nodes included."""
    out = set()
    for key in _leaves(name):
        parts = key.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


# --------------------------------------------------------------------------- the tree


@pytest.mark.parametrize("name", NAMES)
def test_every_verl_key_is_in_our_tree(name):
    verl, more = config_table.reference_keys(name)
    paths = _paths(name)
    missing = [k for k in list(verl) + more if k not in paths]
    assert missing == [], f"{name}: veRL keys missing from configs/{name}.yaml: {missing}"


def test_the_reference_lists_are_veRLs_sizes():
    # 899 leaf keys of veRL 0.9.1's composed ppo_trainer (the number issue 14 counted), 193 of its
    # sft_trainer_engine, 9 of its evaluation.yaml, 44 of veRL main's generation.yaml
    sizes = {name: len(config_table.reference_keys(name)[0]) for name in NAMES}
    assert sizes == {"ppo_trainer": 899, "generation": 44, "evaluation": 9, "sft_trainer": 193}


@pytest.mark.parametrize("name", NAMES)
def test_every_key_has_exactly_one_status(name):
    table = TABLES[name]
    no_status, ambiguous = [], []
    for key in _leaves(name):
        if table.alias_of(key) is not None:
            continue
        rules = table.matching_rules(key)
        if not rules:
            no_status.append(key)
            continue
        best = max(r.specificity for r in rules)
        if len({r.status for r in rules if r.specificity == best}) > 1:
            ambiguous.append((key, [r.pattern for r in rules if r.specificity == best]))
    assert no_status == [], f"keys without a status (declared in hybridflow/config/): {no_status}"
    assert ambiguous == []


@pytest.mark.parametrize("name", NAMES)
def test_aliases_point_at_keys_of_the_tree(name):
    table, leaves = TABLES[name], _leaves(name)
    legacy = [k for k in leaves if table.alias_of(k) is not None]
    assert legacy, "every config keeps at least one earlier spelling"
    assert [k for k in legacy if table.alias_of(k) not in leaves] == []


@pytest.mark.parametrize("name", NAMES)
def test_literal_rule_patterns_name_existing_keys(name):
    # a typo in a rule would otherwise leave the real key without its status
    leaves = _leaves(name)
    literal = [r.pattern for r in TABLES[name].rules if "*" not in r.pattern and not r.shared]
    assert [p for p in literal if p not in leaves] == []


@pytest.mark.parametrize("name", NAMES)
def test_defaults_are_veRLs_unless_the_yaml_says_why(name):
    verl, _ = config_table.reference_keys(name)
    ours = _leaves(name)
    comments = key_comments(config_dir() / f"{name}.yaml")
    undocumented = []
    for key, row in verl.items():
        if key not in ours or ours[key] == row["default"]:
            continue
        if "${" in str(row.get("raw", row["default"])):
            continue  # veRL's value follows another key; that key is compared itself
        if not any("hybridflow" in c for c in comments.get(key, [])):
            undocumented.append((key, row["default"], ours[key]))
    assert undocumented == [], f"defaults that differ from veRL's without a 'hybridflow:' comment: {undocumented}"


def test_the_status_table_is_current():
    assert config_table.DOC_PATH.read_text() == config_table.render(), (
        "docs/config_keys.md is stale: run python -m devtools.config_table"
    )


def test_the_table_lists_every_key_with_its_status():
    text = config_table.DOC_PATH.read_text()
    for name in NAMES:
        section = text.split(f"## {name} ")[1].split("\n## ")[0]
        for key in _leaves(name):
            assert f"| `{key}`" in section, f"{name}: {key} is not in the table"
        assert "|  |  |" not in section  # no row without a status


def test_readme_links_the_table():
    readme = (Path(config_table.DOC_PATH).parents[1] / "README.md").read_text()
    assert "docs/config_keys.md" in readme


# --------------------------------------------------------------------------- behaviour


def test_not_supported_is_accepted_at_its_default_and_refused_when_set():
    load_config("ppo_trainer", ["algorithm.use_pf_ppo=False"])  # veRL's default, written out
    with pytest.raises(ConfigError) as e:
        load_config(
            "ppo_trainer",
            [
                "actor_rollout_ref.rollout.scheduling_policy=priority",
                "actor_rollout_ref.rollout.router_config_path=my.json",
            ],
        )
    msg = str(e.value)
    assert "actor_rollout_ref.rollout.scheduling_policy='priority' is not supported by hybridflow" in msg
    assert (
        "actor_rollout_ref.rollout.router_config_path='my.json' is not supported by hybridflow" in msg
    )  # every refusal at once


def test_honoured_keys_with_values_refuse_the_others():
    load_config("ppo_trainer", ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.strategy=fsdp2"])
    with pytest.raises(
        ConfigError, match=r"actor_rollout_ref.rollout.name='sglang' is not supported.*supported: 'hf', 'vllm'"
    ):
        load_config("ppo_trainer", ["actor_rollout_ref.rollout.name=sglang"])


def test_a_key_following_an_interpolation_is_not_set_by_itself():
    # rollout.prometheus.served_model_name (not supported) follows model.path; changing the latter is fine
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.model.path=/models/mine"])
    assert cfg.actor_rollout_ref.rollout.prometheus.served_model_name == "/models/mine"
    with pytest.raises(ConfigError, match="rollout.prometheus.served_model_name='x' is not supported"):
        load_config("ppo_trainer", ["actor_rollout_ref.rollout.prometheus.served_model_name=x"])


def test_notes_for_settings_that_do_not_apply_here():
    notes = []
    load_config("ppo_trainer", ["actor_rollout_ref.model.use_liger=True", "data.dataloader_num_workers=2"], notes=notes)
    assert len(notes) == 2
    assert any(n.startswith("actor_rollout_ref.model.use_liger=True is accepted but not applied") for n in notes)
    notes = []
    load_config("ppo_trainer", ["actor_rollout_ref.model.use_liger=False"], notes=notes)  # the default
    assert notes == []


def test_an_added_key_that_nothing_reads_is_refused_and_megatron_keys_say_why():
    with pytest.raises(ConfigError) as e:
        load_config(
            "ppo_trainer",
            [
                "+trainer.my_flag=1",
                "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
            ],
        )
    msg = str(e.value)
    assert "trainer.my_flag is not a ppo_trainer key (it was added with +)" in msg
    assert (
        "megatron.override_transformer_config.recompute_method='uniform' is not supported" in msg and "Megatron" in msg
    )


def test_an_added_key_under_the_wrong_section_names_where_veRL_reads_it():
    # veRL 0.9's SAPO example adds the smoothing temperatures under policy_loss; veRL reads them on the actor
    with pytest.raises(ConfigError) as e:
        load_config("ppo_trainer", ["+actor_rollout_ref.actor.policy_loss.tau_pos=1.0"])
    assert (
        "actor_rollout_ref.actor.policy_loss.tau_pos is not a ppo_trainer key (it was added with +): hybridflow "
        "would not read it. Did you mean: actor_rollout_ref.actor.tau_pos," in str(e.value)
    )
    assert "_target_" not in str(e.value)


@pytest.mark.parametrize(
    "legacy,canonical,value",
    [
        ("reward_model.enable", "reward.reward_model.enable", True),
        ("reward_model.model.path", "reward.reward_model.model_path", "/rm"),
        ("reward_model.reward_manager", "reward.reward_manager.name", "naive"),
        ("custom_reward_function.path", "reward.custom_reward_function.path", "/f.py"),
        ("ray_init.num_cpus", "ray_kwargs.ray_init.num_cpus", 3),
        ("actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.clip_grad", 0.5),
        ("actor_rollout_ref.actor.optim.warmup_style", "actor_rollout_ref.actor.optim.lr_scheduler_type", "cosine"),
        ("critic.model.fsdp_config.param_offload", "critic.fsdp.param_offload", True),
    ],
)
def test_both_spellings_reach_the_canonical_key(legacy, canonical, value):
    text = str(value).lower() if isinstance(value, bool) else value
    for written in (legacy, canonical):
        cfg = load_config("ppo_trainer", [f"{written}={text}"])
        assert _select(cfg, canonical) == value
        assert _select(cfg, legacy) == value  # the earlier spelling reads the same afterwards


def _select(cfg, key):
    node = cfg
    for part in key.split("."):
        node = node[part]
    return node


def test_ray_init_timeline_goes_to_ray_kwargs_not_ray_init():
    config = load_config("ppo_trainer", ["ray_init.timeline_json_file=/t.json"])  # the earlier spelling
    assert config.ray_kwargs.timeline_json_file == "/t.json"
    assert config.ray_kwargs.ray_init.num_cpus is None  # not read as an argument of ray.init


def test_two_different_values_for_one_setting_are_an_error():
    with pytest.raises(ConfigError) as e:
        load_config("ppo_trainer", ["reward_model.enable=True", "reward.reward_model.enable=False"])
    assert "reward_model.enable=True and reward.reward_model.enable=False" in str(e.value)
    # the same value twice is fine
    assert (
        load_config(
            "ppo_trainer", ["ray_init.num_cpus=2", "ray_kwargs.ray_init.num_cpus=2"]
        ).ray_kwargs.ray_init.num_cpus
        == 2
    )


def test_earlier_sft_spellings():
    cfg = load_config(
        "sft_trainer",
        [
            "model.partial_pretrain=/m",
            "optim.lr_scheduler=cosine",
            "optim.warmup_steps_ratio=0.1",
            "model.strategy=ddp",
            "trainer.checkpoint.save_contents=[hf_model]",
        ],
    )
    assert cfg.model.path == "/m" and cfg.optim.lr_scheduler_type == "cosine" and cfg.optim.lr_warmup_steps_ratio == 0.1
    assert cfg.engine.strategy == "ddp" and list(cfg.checkpoint.save_contents) == ["hf_model"]


def test_flipping_a_status_is_a_data_change(monkeypatch):
    table = TABLES["ppo_trainer"]
    old = table.rule_for("actor_rollout_ref.rollout.router_config_path")
    assert old.status == NOT_SUPPORTED
    flipped = KeyTable(
        table.name,
        tuple(dataclasses.replace(r, status=HONOURED, reason="") if r is old else r for r in table.rules),
        table.aliases,
    )
    monkeypatch.setitem(config_keys.TABLES, "ppo_trainer", flipped)
    config = load_config("ppo_trainer", ["actor_rollout_ref.rollout.router_config_path=my.json"])
    assert config.actor_rollout_ref.rollout.router_config_path == "my.json"


def test_user_config_extending_ppo_trainer_the_verl_way(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "hydra:\n  searchpath:\n    - pkg://verl.trainer.config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  train_batch_size: 7\nactor_rollout_ref:\n  rollout:\n    multi_turn:\n      enable: true\n"
        "    scheduling_policy: priority\n"
    )
    # the file's own keys are checked like command-line ones: an unimplemented one is refused by name
    with pytest.raises(ConfigError, match="rollout.scheduling_policy='priority' is not supported"):
        load_config("mine", [], config_path=tmp_path, kind="ppo_trainer")
    cfg = load_config(
        "mine", ["actor_rollout_ref.rollout.scheduling_policy=fcfs"], config_path=tmp_path, kind="ppo_trainer"
    )
    assert cfg.data.train_batch_size == 7 and cfg.trainer.backend == "ray"
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable is True
    (tmp_path / "mega.yaml").write_text("defaults:\n  - ppo_megatron_trainer\n  - _self_\n")
    with pytest.raises(ConfigError, match="ppo_megatron_trainer.*not supported.*Megatron"):
        load_config("mega", [], config_path=tmp_path, kind="ppo_trainer")


@pytest.mark.parametrize("engine,name", [("megatron", "Megatron"), ("veomni", "VeOmni"), ("torchtitan", "TorchTitan")])
def test_another_model_engine_is_refused_by_name_before_its_keys(engine, name):
    """veRL's model_engine=megatron brings actor.megatron.* keys: the engine is named, not the keys as unknown."""
    overrides = [f"actor_rollout_ref.actor.{engine}.param_offload=True", f"model_engine={engine}"]
    with pytest.raises(ConfigError, match=f"model_engine='{engine}' is not supported by hybridflow: {name}"):
        load_config("ppo_trainer", overrides)


def test_raw_defaults_keep_interpolations():
    raw = raw_default_config("ppo_trainer")
    assert raw["critic"]["ppo_mini_batch_size"].startswith("${")
    assert default_config("ppo_trainer")["critic"]["ppo_mini_batch_size"] == 256
