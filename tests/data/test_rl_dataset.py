import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.data.rl_dataset import RLHFDataset, collate_fn, truncate_ids
from hybridflow.models.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def ids_of(text: str) -> list[int]:
    # tiny vocabulary: ids 0..3 are specials, then ASCII 32..126, then "\n" = 99
    out, i = [], 0
    specials = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    while i < len(text):
        for s, sid in specials.items():
            if text.startswith(s, i):
                out.append(sid)
                i += len(s)
                break
        else:
            out.append(99 if text[i] == "\n" else 4 + ord(text[i]) - 32)
            i += 1
    return out


def chat(content: str) -> str:
    return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


def row(content, i=0, gt="1"):
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gt},
        "extra_info": {"split": "train", "index": 100 + i},
    }


def write(tmp_path, name, rows):
    path = str(tmp_path / name)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_left_padding_mask_positions_and_columns(tmp_path, tok):
    path = write(tmp_path, "a.parquet", [row("ab", 0, "7")])
    ds = RLHFDataset(path, tok, {"max_prompt_length": 24, "return_raw_chat": True, "return_full_prompt": True})
    item = ds[0]
    expected = ids_of(chat("ab"))
    assert len(expected) == 21  # 1 + len("user\n") + 2 + 1 + 1 + 1 + len("assistant\n")
    assert item["input_ids"].tolist() == [0, 0, 0] + expected
    assert item["attention_mask"].tolist() == [0] * 3 + [1] * 21
    # first real token gets position 0; the pads are clipped to 0 as well
    assert item["position_ids"].tolist() == [0, 0, 0] + list(range(21))
    assert item["raw_prompt_ids"] == expected
    assert item["raw_prompt"] == [{"role": "user", "content": "ab"}]
    assert item["full_prompts"] == chat("ab")
    assert item["reward_model"] == {"style": "rule", "ground_truth": "7"}
    assert item["data_source"] == "openai/gsm8k" and item["ability"] == "math"
    assert item["index"] == 100  # from extra_info.index
    assert "prompt" not in item


@pytest.mark.parametrize(
    "truncation,max_len,keep",
    [
        ("left", 10, lambda ids: ids[-10:]),
        ("right", 10, lambda ids: ids[:10]),
        ("middle", 10, lambda ids: ids[:5] + ids[-5:]),
        ("middle", 7, lambda ids: ids[:3] + ids[-4:]),  # head = 7 // 2, tail = the rest
    ],
)
def test_truncation_keeps_the_expected_tokens(tmp_path, tok, truncation, max_len, keep):
    path = write(tmp_path, "a.parquet", [row("ab")])
    cfg = {"max_prompt_length": max_len, "truncation": truncation, "filter_overlong_prompts": False}
    item = RLHFDataset(path, tok, cfg)[0]
    full = ids_of(chat("ab"))
    assert item["input_ids"].tolist() == keep(full) == item["raw_prompt_ids"]
    assert item["attention_mask"].tolist() == [1] * max_len


def test_truncate_ids_middle_with_one_token():
    assert truncate_ids([1, 2, 3], 1, "middle") == [3]
    assert truncate_ids([1, 2, 3], 5, "error") == [1, 2, 3]


def test_truncation_error_names_row_and_lengths(tmp_path, tok):
    path = write(tmp_path, "a.parquet", [row("a"), row("a" * 30, 1)])
    ds = RLHFDataset(path, tok, {"max_prompt_length": 25, "truncation": "error", "filter_overlong_prompts": False})
    assert ds[0]["input_ids"].shape == (25,)
    with pytest.raises(ValueError, match=r"row 1 has 49 tokens > max_prompt_length=25"):  # 19 + 30
        ds[1]


def test_filter_overlong_prompts_drops_and_reports(tmp_path, tok, caplog):
    caplog.set_level(logging.INFO, logger="hybridflow")
    path = write(tmp_path, "a.parquet", [row("a" * 5, 0), row("a" * 20, 1), row("a" * 6, 2)])
    ds = RLHFDataset(path, tok, OmegaConf.create({"max_prompt_length": 25, "filter_overlong_prompts": True}))
    assert len(ds) == 2 and [ds[i]["index"] for i in range(2)] == [100, 102]
    out = caplog.text
    assert "filtered out 1 of 3" in out and "longest: 39 tokens" in out  # 19 template tokens + 20


def test_every_prompt_overlong_is_an_error(tmp_path, tok):
    path = write(tmp_path, "a.parquet", [row("a" * 10), row("a" * 12)])
    with pytest.raises(ValueError, match=r"all 2 prompts .* max_prompt_length=20 \(longest: 31 tokens\)"):
        RLHFDataset(path, tok, {"max_prompt_length": 20, "filter_overlong_prompts": True})


def test_missing_file_names_the_path(tmp_path, tok):
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        RLHFDataset(missing, tok, {})


def test_missing_prompt_key_names_file_and_columns(tmp_path, tok):
    path = write(tmp_path, "q.parquet", [{"question": "x", "answer": "y"}])
    with pytest.raises(KeyError, match=r"q\.parquet.*'prompt'.*\['question', 'answer'\]"):
        RLHFDataset(path, tok, {"prompt_key": "prompt"})


def test_empty_file_is_named(tmp_path, tok):
    schema = pa.schema([("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))])
    path = str(tmp_path / "empty.parquet")
    pq.write_table(schema.empty_table(), path)
    with pytest.raises(ValueError, match="empty.parquet has no rows"):
        RLHFDataset(path, tok, {})


def test_tokenizer_without_chat_template_is_named(tmp_path):
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    tok.name_or_path = "my-base-model"
    path = write(tmp_path, "a.parquet", [row("a")])
    with pytest.raises(ValueError, match="my-base-model.*no chat template"):
        RLHFDataset(path, tok, {})


def test_bad_truncation_value_is_rejected(tmp_path, tok):
    path = write(tmp_path, "a.parquet", [row("a")])
    with pytest.raises(ValueError, match="truncation"):
        RLHFDataset(path, tok, {"truncation": "both"})


def test_many_files_plain_text_prompt_and_chat_template_kwargs(tmp_path):
    tok = build_tiny_tokenizer()
    tok.chat_template = "{{ prefix }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    a = write(tmp_path, "a.parquet", [row("x"), row("y", 1)])
    b = write(tmp_path, "b.parquet", [{"prompt": "z", "data_source": "other"}])  # no extra_info column
    ds = RLHFDataset([a, b], tok, {"max_prompt_length": 4, "apply_chat_template_kwargs": {"prefix": "P:"}})
    assert len(ds) == 3
    assert [ds[i]["raw_prompt_ids"] for i in range(3)] == [ids_of("P:x"), ids_of("P:y"), ids_of("P:z")]
    third = ds[2]
    assert third["extra_info"] is None and third["index"] == 2  # falls back to the row position
    assert third["data_source"] == "other"


def test_collate_builds_a_dataproto(tiny_data_dir, tiny_tokenizer):
    from hybridflow.protocol import DataProto

    ds = RLHFDataset(os.path.join(tiny_data_dir, "train.parquet"), tiny_tokenizer, {"max_prompt_length": 128})
    assert len(ds) == 64
    batch = collate_fn([ds[i] for i in range(4)])
    assert batch["input_ids"].shape == (4, 128) and batch["input_ids"].dtype == torch.long
    assert isinstance(batch["raw_prompt_ids"], np.ndarray) and batch["raw_prompt_ids"].dtype == object
    assert isinstance(batch["raw_prompt_ids"][0], list)
    assert batch["index"].tolist() == [0, 1, 2, 3]
    proto = DataProto.from_single_dict(batch)
    assert len(proto) == 4
    assert set(proto.batch.keys()) == {"input_ids", "attention_mask", "position_ids"}
    assert proto.non_tensor_batch["reward_model"][2] == ds[2]["reward_model"]
    # every prompt is left padded: its last token is the newline after "assistant"
    assert (proto.batch["input_ids"][:, -1] == 99).all() and (proto.batch["attention_mask"][:, -1] == 1).all()
