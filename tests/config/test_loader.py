"""load_config: veRL command lines compose; unknown keys and wrong types fail early and helpfully."""

import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from hybridflow.config.loader import ConfigError, config_dir, load_config, main_entry, parse_cli, suggest_keys

# veRL's quickstart (docs, "PPO on GSM8K"), paths made local.
QUICKSTART = [
    "data.train_files=/tmp/gsm8k/train.parquet",
    "data.val_files=/tmp/gsm8k/test.parquet",
    "data.train_batch_size=256",
    "data.max_prompt_length=512",
    "data.max_response_length=256",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.optim.lr=1e-5",
    "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=console",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=15",
]


def test_verl_quickstart_composes():
    cfg = load_config("ppo_trainer", QUICKSTART)
    assert cfg.data.train_batch_size == 256
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.critic.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert cfg.trainer.val_before_train is False
    assert list(cfg.trainer.logger) == ["console"]
    # rollout lengths follow the data section, critic's mini batch follows the actor's
    assert cfg.actor_rollout_ref.rollout.response_length == 256
    assert cfg.critic.ppo_mini_batch_size == 64
    assert cfg.critic.forward_micro_batch_size_per_gpu == 4


def test_verl_quickstart_with_logger_list():
    cfg = load_config("ppo_trainer", QUICKSTART[:-7] + ["trainer.logger=['console']"] + QUICKSTART[-6:])
    assert list(cfg.trainer.logger) == ["console"]


def test_unknown_key_names_the_closest_key():
    with pytest.raises(ConfigError) as e:
        load_config("ppo_trainer", ["actor_rollout_ref.actor.optim.lrr=1"])
    msg = str(e.value)
    assert "'actor_rollout_ref.actor.optim.lrr'" in msg
    assert "Did you mean: actor_rollout_ref.actor.optim.lr," in msg  # the best guess comes first
    assert "+actor_rollout_ref.actor.optim.lrr=" in msg  # and how to add a key on purpose


@pytest.mark.parametrize(
    "typo,best",
    [
        ("actor.lr", "actor_rollout_ref.actor.optim.lr"),  # by last component, preferring shared parts
        ("rollout.n", "actor_rollout_ref.rollout.n"),  # a suffix of a valid key
        ("trainer.nnode", "trainer.nnodes"),  # a spelling slip
        ("data.trainbatch_size", "data.train_batch_size"),
    ],
)
def test_suggestions(typo, best):
    with pytest.raises(ConfigError) as e:
        load_config("ppo_trainer", [f"{typo}=1"])
    assert f"Did you mean: {best}" in str(e.value)


def test_suggestions_skip_ancestors_of_the_key():
    tree = {"a": {"b": {"c": 1}}}
    assert "a.b" not in suggest_keys("a.b.cc", tree)
    assert suggest_keys("a.b.cc", tree)[0] == "a.b.c"


def test_every_bad_override_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        load_config("ppo_trainer", ["trainer.nnode=2", "critic.optim.lr=fast"])
    assert "trainer.nnode" in str(e.value) and "critic.optim.lr" in str(e.value)


@pytest.mark.parametrize(
    "override,expected",
    [
        ("data.train_batch_size=abc", "int"),
        ("data.max_prompt_length=1.5", "int"),
        ("trainer.val_before_train=3", "bool"),
        ("actor_rollout_ref.actor.optim.lr=high", "float"),
        ("actor_rollout_ref.rollout.n=[1,2]", "int"),
        ("actor_rollout_ref.model.override_config=3", "dict"),
        ("data.truncation=True", "str"),
    ],
)
def test_wrong_type_names_key_type_and_value(override, expected):
    key, value = override.split("=", 1)
    with pytest.raises(ConfigError) as e:
        load_config("ppo_trainer", [override])
    msg = str(e.value)
    assert repr(key) in msg and f"expects {expected}" in msg and value.strip("[]").split(",")[0] in msg


def test_type_leniency_that_veRL_users_rely_on():
    cfg = load_config(
        "ppo_trainer",
        [
            "actor_rollout_ref.actor.optim.lr=1",  # int for a float
            "data.seed=null",  # null anywhere
            "data.max_response_length=None",  # Python's spelling of null
            "data.train_files=[/a.parquet,/b.parquet]",  # a list of files where the default is one path
            "trainer.experiment_name=2024",  # a number for a string key stays the string
            "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=2",  # bool or int
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
            "critic.model.path=${actor_rollout_ref.model.path}",  # interpolation in a value
        ],
    )
    assert cfg.actor_rollout_ref.actor.optim.lr == 1
    assert cfg.data.seed is None and cfg.data.max_response_length is None
    assert list(cfg.data.train_files) == ["/a.parquet", "/b.parquet"]
    assert cfg.trainer.experiment_name == "2024"
    assert cfg.trainer.default_local_dir == "checkpoints/hybridflow_examples/2024"
    assert cfg.actor_rollout_ref.actor.fsdp_config.reshard_after_forward == 2
    assert cfg.critic.model.path == cfg.actor_rollout_ref.model.path


def test_add_delete_and_force_add():
    cfg = load_config(
        "ppo_trainer",
        [
            "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
            "~data.video_key",
            "++trainer.total_epochs=2",
            "++actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        ],
    )
    assert cfg.actor_rollout_ref.model.override_config.attention_dropout == pytest.approx(0.1)
    assert "video_key" not in cfg.data
    assert cfg.trainer.total_epochs == 2 and cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space == 4
    # a key that nothing reads is not added silently: each one is named
    with pytest.raises(ConfigError) as e:
        load_config("ppo_trainer", ["+new.key=1", "++trainer.brand_new=x"])
    assert "new.key is not a ppo_trainer key" in str(e.value) and "trainer.brand_new is not a ppo_trainer key" in str(
        e.value
    )
    # a config of the user's own, without a key table, takes any key
    assert load_config("evaluation", ["+new.key=1"], kind="no-table").new.key == 1


def test_adding_an_existing_key_sets_it():
    # hybridflow's tree holds keys veRL users must add with + (fsdp_config.mixed_precision, ...): + sets them
    cfg = load_config(
        "ppo_trainer", ["+trainer.nnodes=2", "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"]
    )
    assert cfg.trainer.nnodes == 2 and cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "bf16"
    with pytest.raises(ConfigError, match="expects int"):  # still type-checked
        load_config("ppo_trainer", ["+trainer.nnodes=two"])


def test_a_free_form_mapping_takes_new_keys_without_plus():
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.model.override_config.attention_dropout=0.0"])
    assert cfg.actor_rollout_ref.model.override_config.attention_dropout == 0.0


def test_list_override():
    cfg = load_config(
        "ppo_trainer", ["trainer.logger=['console','wandb']", "actor_rollout_ref.actor.optim.betas=[0.9,0.95]"]
    )
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert list(cfg.actor_rollout_ref.actor.optim.betas) == [0.9, 0.95]


def test_sweep_syntax_is_refused_with_a_hint():
    with pytest.raises(ConfigError, match=r"trainer.logger=\[a,b\]"):
        load_config("ppo_trainer", ["trainer.logger=console,wandb"])


def test_interpolations_follow_overrides():
    cfg = load_config(
        "ppo_trainer",
        ["data.max_prompt_length=100", "actor_rollout_ref.actor.use_dynamic_bsz=True", "trainer.project_name=p"],
    )
    assert cfg.actor_rollout_ref.rollout.prompt_length == 100
    assert cfg.actor_rollout_ref.ref.log_prob_use_dynamic_bsz is True
    assert cfg.critic.use_dynamic_bsz is True and cfg.reward_model.use_dynamic_bsz is True
    assert cfg.trainer.default_local_dir == "checkpoints/p/gsm8k"
    assert cfg.actor_rollout_ref.actor.checkpoint.load_contents == cfg.actor_rollout_ref.actor.checkpoint.save_contents


def test_config_is_read_only_and_struct():
    cfg = load_config("ppo_trainer", [])
    with pytest.raises(ReadonlyConfigError):
        cfg.data.train_batch_size = 2
    with pytest.raises(Exception):  # noqa: B017  (omegaconf's error class differs by version)
        cfg.data.not_a_key = 1
    with pytest.raises(Exception):  # noqa: B017
        _ = cfg.data.not_a_key
    assert OmegaConf.is_readonly(cfg.actor_rollout_ref.actor.optim)


def test_unknown_config_name_lists_known_ones():
    with pytest.raises(ConfigError, match="ppo_trainer"):
        load_config("ppo_trainerr", [])


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_unparsable_override_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config("ppo_trainer", ["data.train_files=[a"])


def test_own_config_directory(tmp_path):
    (tmp_path / "mine.yaml").write_text("a:\n  b: 1\n  c: ${a.b}\n")
    cfg = load_config("mine", ["a.b=5"], config_path=tmp_path)
    assert cfg.a.c == 5
    with pytest.raises(ConfigError, match="Did you mean: a.b"):
        load_config("mine.yaml", ["a.bb=5"], config_path=tmp_path)


def test_callers_hydra_state_is_left_alone():
    with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
        load_config("evaluation", ["data.path=/x.parquet"])
        assert GlobalHydra.instance().is_initialized()
        assert compose(config_name="evaluation").data.prompt_key == "prompt"  # the caller's Hydra still works
    assert not GlobalHydra.instance().is_initialized()


def test_parse_cli_flags(capsys, tmp_path):
    cfg = parse_cli("ppo_trainer", ["trainer.nnodes=2"])
    assert cfg.trainer.nnodes == 2
    (tmp_path / "other.yaml").write_text("trainer:\n  nnodes: 1\n")
    assert (
        parse_cli(
            "ppo_trainer", ["--config-path", str(tmp_path), "--config-name=other", "trainer.nnodes=3"]
        ).trainer.nnodes
        == 3
    )
    # main_ppo's key statuses apply to the user's file too
    (tmp_path / "other.yaml").write_text(
        "trainer:\n  nnodes: 1\nactor_rollout_ref:\n  rollout:\n    router_config_path: my.json\n"
    )
    with pytest.raises(SystemExit):
        parse_cli("ppo_trainer", ["--config-path", str(tmp_path), "--config-name=other"])
    assert "actor_rollout_ref.rollout.router_config_path='my.json' is not supported" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        parse_cli("evaluation", ["--cfg", "job", "data.prompt_key=q"])
    assert e.value.code == 0 and "prompt_key: q" in capsys.readouterr().out


def test_parse_cli_reports_errors_without_traceback(capsys):
    with pytest.raises(SystemExit) as e:
        parse_cli("ppo_trainer", ["trainer.nnode=2"])
    assert e.value.code == 2
    assert "trainer.nnodes" in capsys.readouterr().err


def test_main_entry_reads_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["main_generation", "data.n_samples=2", "rollout.name=vllm"])
    cfg = main_entry("generation")
    assert cfg.data.n_samples == 2 and cfg.rollout.name == "vllm"


def test_an_override_is_checked_against_the_keys_declared_type():
    """Union[float, str] on rollout_is_threshold (IcePop's 'lower_upper') takes a string; a key declared int
    does not take a list, and the message lists what the declaration allows."""
    cfg = load_config("ppo_trainer", ["algorithm.rollout_correction.rollout_is_threshold=0.5_5.0"])
    assert cfg.algorithm.rollout_correction.rollout_is_threshold == "0.5_5.0"
    with pytest.raises(ConfigError, match=r"'algorithm.rollout_correction.rollout_is_threshold' expects float or str"):
        load_config("ppo_trainer", ["algorithm.rollout_correction.rollout_is_threshold=[1,2]"])


def test_value_kinds_read_the_field_annotations():
    from dataclasses import dataclass, field
    from typing import Any

    from hybridflow.config.tree import value_kinds

    @dataclass
    class Inner:
        files: str | list[str] = "a"
        anything: Any = None

    @dataclass
    class Outer:
        n: int = 1
        lr: float | None = None
        flag: bool = False
        mapping: dict = field(default_factory=dict)
        inner: Inner = field(default_factory=Inner)

    assert value_kinds(Outer()) == {
        "n": ("int",),
        "lr": ("float",),
        "flag": ("bool",),
        "mapping": ("dict",),
        "inner.files": ("str", "list"),
    }


def test_veRLs_sft_group_choices_that_hybridflow_holds_change_nothing_and_others_are_refused():
    # every veRL 0.9 SFT example picks its engine and optimizer groups on the command line
    chosen = load_config("sft_trainer", ["engine=fsdp", "optim=fsdp", "model=hf_model", "optim.lr=1e-4"])
    assert chosen == load_config("sft_trainer", ["optim.lr=1e-4"])
    with pytest.raises(ConfigError) as e:
        load_config("sft_trainer", ["engine=megatron", "optim=automodel", "model=other"])
    msg = str(e.value)
    assert "'engine=megatron' is not supported by hybridflow: Megatron is not a hybridflow training engine" in msg
    assert "'optim=automodel' is not supported by hybridflow: AutoModel is not" in msg
    assert "'model=other' is not supported by hybridflow: hybridflow's option of this group is 'hf_model'" in msg
    # ppo_trainer's role configs: the FSDP one is hybridflow's, another engine's is refused by name
    plain = load_config("ppo_trainer", ["actor@actor_rollout_ref.actor=dp_actor", "critic=dp_critic"])
    assert plain == load_config("ppo_trainer", [])
    with pytest.raises(
        ConfigError,
        match="'actor@actor_rollout_ref.actor=megatron_actor' is not supported by hybridflow: "
        "Megatron is not a hybridflow training engine",
    ):
        load_config("ppo_trainer", ["actor@actor_rollout_ref.actor=megatron_actor"])
