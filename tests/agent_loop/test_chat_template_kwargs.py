"""``data.apply_chat_template_kwargs`` reaches every place a chat template is applied.

The tokenizer's template here raises unless the ``flavour`` kwarg is given and writes it at the start,
so a path that drops the kwargs fails, and one that passes them shows the flavour in its prompt."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.models.tiny import CHAT_TEMPLATE

FLAVOUR = "[mint]"
STRICT_TEMPLATE = (
    "{%- if flavour is not defined %}{{ raise_exception('flavour kwarg missing') }}{%- endif %}"
    "{{- flavour }}" + CHAT_TEMPLATE
)
KWARGS = {"flavour": FLAVOUR}


@pytest.fixture(scope="module")
def strict_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with the strict template (a copy: the session's tiny model stays as it is)."""
    import shutil

    from transformers import AutoTokenizer

    out = str(tmp_path_factory.mktemp("strict_template"))
    shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = STRICT_TEMPLATE
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def strict_tok(strict_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(strict_model_dir)


def _rl_parquet(tmp_path, agent_name="tool_agent"):
    rows = [
        {
            "prompt": [{"role": "user", "content": q}],
            "data_source": "openai/gsm8k",
            "agent_name": agent_name,
            "reward_model": {"ground_truth": "1"},
            "extra_info": {"index": i},
        }
        for i, q in enumerate(["1+2?", "3+4?"])
    ]
    path = str(tmp_path / f"{agent_name}.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _prompt_texts(tok, out):
    return [
        tok.decode(row[mask.bool()], skip_special_tokens=False)
        for row, mask in zip(out.batch["prompts"], out.batch["attention_mask"][:, : out.batch["prompts"].size(1)])
    ]


def test_the_strict_template_needs_the_kwarg(strict_tok):
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(Exception, match="flavour kwarg missing"):
        strict_tok.apply_chat_template(msgs, tokenize=False)
    assert strict_tok.apply_chat_template(msgs, tokenize=False, **KWARGS).startswith(FLAVOUR)


def test_sft_datasets(strict_tok, tmp_path):
    from hybridflow.data.multiturn_sft_dataset import MultiTurnSFTDataset
    from hybridflow.data.sft_dataset import SFTDataset

    path = str(tmp_path / "sft.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": "ab", "response": "c"}]), path)
    item = SFTDataset(
        path,
        strict_tok,
        {"prompt_key": "prompt", "response_key": "response", "max_length": 40, "apply_chat_template_kwargs": KWARGS},
    )[0]
    assert strict_tok.decode(item["input_ids"][item["attention_mask"].bool()]).startswith(FLAVOUR)
    conv = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"}]
    path = str(tmp_path / "conv.parquet")
    pq.write_table(pa.Table.from_pylist([{"messages": json.dumps(conv)}]), path)
    item = MultiTurnSFTDataset(path, strict_tok, {"max_length": 60, "apply_chat_template_kwargs": KWARGS})[0]
    assert strict_tok.decode(item["input_ids"][item["attention_mask"].bool()]).startswith(FLAVOUR)


def test_hf_rollout_and_eval_helpers_template_with_the_kwargs(strict_model_dir, strict_tok, tmp_path):
    """greedy_agent_eval (dataset + HFRollout + tool_agent, which re-templates raw_prompt) and
    greedy_accuracy (dataset + single turn) both render with the kwargs; a per-call meta_info value wins."""
    from hybridflow.trainer.eval_utils import greedy_accuracy, greedy_agent_eval

    data = _rl_parquet(tmp_path)
    _, records = greedy_agent_eval(
        strict_model_dir,
        data,
        {"multi_turn": {"format": "hermes"}},
        response_length=4,
        max_prompt_length=64,
        chat_template_kwargs=KWARGS,
    )
    assert len(records) == 2
    plain = _rl_parquet(tmp_path, "single_turn_agent")
    assert greedy_accuracy(strict_model_dir, plain, response_length=2, chat_template_kwargs=KWARGS) == 0.0
    with pytest.raises(Exception, match="flavour kwarg missing"):
        greedy_accuracy(strict_model_dir, plain, response_length=2)


def test_rollout_worker_generate_sequences_honours_meta_kwargs(strict_model_dir, strict_tok, tmp_path):
    """RolloutHost.generate_sequences (main_generation's worker) with tool_agent rows: the loop templates
    the raw chat itself, with the caller's apply_chat_template_kwargs."""
    from hybridflow.config.loader import load_config
    from hybridflow.data.rl_dataset import RLHFDataset, collate_fn
    from hybridflow.protocol import DataProto
    from hybridflow.trainer.generation import build_rollout_group

    config = load_config(
        "generation",
        [
            f"model.path={strict_model_dir}",
            "trainer.backend=inprocess",
            "trainer.device=cpu",
            "rollout.prompt_length=64",
            "rollout.response_length=4",
            "rollout.do_sample=False",
        ],
    )
    ds = RLHFDataset(_rl_parquet(tmp_path), strict_tok, {"max_prompt_length": 64, "apply_chat_template_kwargs": KWARGS})
    batch = DataProto.from_single_dict(collate_fn([ds[0], ds[1]]))
    batch.meta_info = {
        "apply_chat_template_kwargs": KWARGS,
        "eos_token_id": strict_tok.eos_token_id,
        "pad_token_id": strict_tok.pad_token_id,
    }
    group, shutdown = build_rollout_group(config)
    try:
        group.init_model()
        out = group.generate_sequences(batch)
        texts = _prompt_texts(strict_tok, out)
        assert len(texts) == 2 and all(t.startswith(FLAVOUR) for t in texts), texts
        batch.meta_info["apply_chat_template_kwargs"] = {"flavour": "[lime]"}  # per call, the caller's value
        assert all(t.startswith("[lime]") for t in _prompt_texts(strict_tok, group.generate_sequences(batch)))
        batch.meta_info.pop("apply_chat_template_kwargs")
        with pytest.raises(Exception, match="flavour kwarg missing"):
            group.generate_sequences(batch)
    finally:
        shutdown()


def test_main_generation_passes_data_kwargs(strict_model_dir, tmp_path):
    from hybridflow.main_generation import main as gen_main

    rows = [{"prompt": [{"role": "user", "content": "1+2?"}], "data_source": "openai/gsm8k"}]
    data = str(tmp_path / "in.parquet")
    pq.write_table(pa.Table.from_pylist(rows), data)
    args = [
        f"model.path={strict_model_dir}",
        f"data.path={data}",
        f"data.output_path={tmp_path / 'o.parquet'}",
        "data.n_samples=1",
        "rollout.prompt_length=64",
        "rollout.response_length=2",
        "trainer.backend=inprocess",
        "trainer.device=cpu",
    ]
    out = gen_main([*args, f"+data.apply_chat_template_kwargs.flavour={FLAVOUR}"])
    assert os.path.exists(out) and len(pq.read_table(out).to_pylist()[0]["responses"]) == 1
    with pytest.raises(Exception, match="flavour kwarg missing"):
        gen_main(args)
