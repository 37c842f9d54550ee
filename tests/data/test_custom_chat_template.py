"""actor_rollout_ref.model.custom_chat_template replaces the tokenizer's chat template, as veRL's model
config does: main_ppo's prompts (and the raw chat the agent loops template with the same tokenizer)
come out in the custom format, and the worker's tokenizer (saved with checkpoints) carries it."""

import pytest

from hybridflow import main_ppo
from hybridflow.utils.config import load_config
from hybridflow.workers.model_loading import load_tokenizer
from tests.trainer.e2e_helpers import base_overrides

TEMPLATE = "{% for m in messages %}[[{{ m['content'] }}]]{% endfor %}"
BUILD = main_ppo.build_rl_dataset


class _Stop(Exception):
    pass


def _first_prompt(monkeypatch, tiny_model_dir, tiny_data_dir, tmp_path, *extra) -> tuple[str, str]:
    """(the first training prompt as the model sees it, its user message) from main_ppo's own dataset."""
    seen = {}

    def capture(files, tokenizer, data_config, *limit):
        seen["dataset"] = BUILD(files, tokenizer, data_config)
        seen["tokenizer"] = tokenizer
        raise _Stop  # the data is all this test needs: no backend, no workers

    monkeypatch.setattr(main_ppo, "build_rl_dataset", capture)
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess", steps=1) + list(extra)
    with pytest.raises(_Stop):
        main_ppo.run_ppo(load_config("ppo_trainer", overrides))
    row = seen["dataset"][0]
    return seen["tokenizer"].decode(row["raw_prompt_ids"]), row["raw_prompt"][-1]["content"]


def test_custom_chat_template_formats_main_ppos_prompts(monkeypatch, tiny_model_dir, tiny_data_dir, tmp_path):
    own, content = _first_prompt(monkeypatch, tiny_model_dir, tiny_data_dir, tmp_path)
    assert own != f"[[{content}]]"  # the tiny tokenizer's own template looks different
    custom, content = _first_prompt(
        monkeypatch,
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        f'actor_rollout_ref.model.custom_chat_template="{TEMPLATE}"',
    )
    assert custom == f"[[{content}]]"


def test_load_tokenizer_replaces_the_template(tiny_model_dir):
    assert load_tokenizer(tiny_model_dir).chat_template != TEMPLATE
    tokenizer = load_tokenizer(tiny_model_dir, chat_template=TEMPLATE)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "2+3"}], tokenize=False) == "[[2+3]]"
