"""Start-up checks of the reward model: a genrm judge needs a model and an engine; veRL's engine keys on a
discriminative reward model are explained, not silently dropped."""

import pytest

from hybridflow.config.loader import ConfigError, load_config
from hybridflow.trainer.config_checks import validate_ppo_config
from hybridflow.trainer.ppo.judge_setup import uses_judge
from tests.trainer.test_config_checks import QUICKSTART

GENRM = [
    "reward.reward_manager.name=genrm",
    "reward.reward_model.enable=True",
    "reward.reward_model.model_path=/j",
    "reward.reward_model.rollout.name=hf",
]


def check(*overrides):
    return validate_ppo_config(load_config("ppo_trainer", QUICKSTART + list(overrides)))


def errors_of(*overrides) -> str:
    with pytest.raises(ConfigError) as info:
        check(*overrides)
    return str(info.value)


def test_a_complete_genrm_config_passes_and_uses_the_judge():
    notes = check(*GENRM)
    assert not [n for n in notes if "reward_model" in n]  # veRL's default tp=2 is no reason for a note on hf
    cfg = load_config("ppo_trainer", QUICKSTART + GENRM)
    assert uses_judge(cfg)
    # the legacy spellings of veRL's examples mean the same
    legacy = load_config(
        "ppo_trainer",
        QUICKSTART
        + [
            "reward_model.reward_manager=genrm",
            "reward_model.enable=True",
            "reward_model.model.path=/j",
            "reward_model.rollout.name=vllm",
            "reward_model.rollout.tensor_model_parallel_size=1",
        ],
    )
    assert uses_judge(legacy) and legacy.reward.reward_model.rollout.name == "vllm"
    validate_ppo_config(legacy)


def test_genrm_without_its_model_or_engine_names_the_keys():
    text = errors_of("reward.reward_manager.name=genrm")
    assert "set reward.reward_model.enable=True" in text
    assert "needs reward.reward_model.model_path" in text and "rollout.name set to an engine" in text
    assert not uses_judge(load_config("ppo_trainer", QUICKSTART + ["reward.reward_manager.name=genrm"]))


@pytest.mark.parametrize(
    "override, message",
    [
        ("reward.reward_model.rollout.name=vllm", "tensor_model_parallel_size=2: the judge runs one engine"),
        ("reward.reward_model.rollout.load_format=dummy", "the judge never receives weights"),
        (
            "reward.reward_model.rollout.temperature=0",
            "do_sample=True needs reward.reward_model.rollout.temperature > 0",
        ),
        ("reward.custom_reward_function.path=/x.py", "custom_reward_function.path must be null"),
    ],
)
def test_judge_settings_that_cannot_work_are_errors(override, message):
    assert message in errors_of(*GENRM, override)


def test_engine_keys_on_a_discriminative_reward_model_are_explained():
    notes = check(
        "reward_model.enable=True",
        "reward_model.model.path=/rm",
        "reward_model.rollout.name=vllm",
        "reward_model.micro_batch_size_per_gpu=4",
    )
    assert any("scored as a discriminative (sequence-classification) reward model" in n for n in notes)
    assert any(
        "tensor_model_parallel_size=4 is ignored" in n
        for n in check(*GENRM, "reward.reward_model.rollout.tensor_model_parallel_size=4")
    )


def test_verl_genrm_pattern_with_a_custom_function_is_refused_with_the_way_out():
    text = errors_of(
        "reward.reward_model.enable=True",
        "reward.reward_model.model_path=/j",
        "reward.reward_model.rollout.name=vllm",
        "reward.custom_reward_function.path=/f.py",
        "reward_model.micro_batch_size_per_gpu=4",
    )
    assert "reward_router_address" in text and "reward.reward_manager.name=genrm" in text
