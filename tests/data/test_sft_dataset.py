import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.models.tiny import build_tiny_tokenizer

KEYS = {"prompt_key": "prompt", "response_key": "response"}  # the columns these tests write


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def cid(c):  # tiny vocabulary: printable ASCII at 4 + (ord - 32), "\n" = 99
    return 99 if c == "\n" else 4 + ord(c) - 32


def chat_ids(content):
    # <|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n
    return [1] + [cid(c) for c in "user\n" + content] + [2, 99, 1] + [cid(c) for c in "assistant\n"]


def write(tmp_path, rows, name="sft.parquet"):
    path = str(tmp_path / name)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_right_padding_and_loss_mask_on_response_tokens(tmp_path, tok):
    path = write(tmp_path, [{"prompt": "ab", "response": "c"}])
    item = SFTDataset(path, tok, {**KEYS, "max_length": 26})[0]
    p = chat_ids("ab")
    assert len(p) == 21
    assert item["input_ids"].tolist() == p + [cid("c"), 2] + [0, 0, 0]  # response, eos, pads
    assert item["attention_mask"].tolist() == [1] * 23 + [0] * 3
    assert item["loss_mask"].tolist() == [0] * 21 + [1, 1] + [0] * 3
    assert item["position_ids"].tolist() == list(range(23)) + [22, 22, 22]


def test_truncation_left_right_and_error(tmp_path, tok):
    path = write(tmp_path, [{"prompt": "ab", "response": "cd"}])  # 21 + 3 = 24 tokens
    full = chat_ids("ab") + [cid("c"), cid("d"), 2]
    left = SFTDataset(path, tok, {**KEYS, "max_length": 10, "truncation": "left"})[0]
    assert left["input_ids"].tolist() == full[-10:]
    assert left["loss_mask"].tolist() == [0] * 7 + [1, 1, 1]
    right = SFTDataset(path, tok, {**KEYS, "max_length": 22, "truncation": "right"})[0]
    assert right["input_ids"].tolist() == full[:22]
    assert right["loss_mask"].tolist() == [0] * 21 + [1]  # only "c" survives
    with pytest.raises(ValueError, match=r"row 0 has 24 tokens \(prompt 21 \+ response 3\) > max_length=20"):
        SFTDataset(path, tok, {**KEYS, "max_length": 20, "truncation": "error"})[0]
    with pytest.raises(ValueError, match="truncation"):
        SFTDataset(path, tok, {**KEYS, "truncation": "middle"})


def test_dict_keys_read_nested_fields_like_verl_gsm8k_sft(tiny_data_dir, tok):
    cfg = OmegaConf.create(
        {
            "prompt_key": "extra_info",
            "prompt_dict_keys": ["question"],
            "response_key": "extra_info",
            "response_dict_keys": ["answer"],
            "max_length": 128,
        }
    )
    path = os.path.join(tiny_data_dir, "sft_train.parquet")
    ds = SFTDataset(path, tok, cfg)
    row = pq.read_table(path).to_pylist()[3]
    item = ds[3]
    n_prompt = len(chat_ids(row["extra_info"]["question"]))
    response = [cid(c) for c in row["extra_info"]["answer"]] + [2]
    assert item["input_ids"].tolist()[n_prompt : n_prompt + len(response)] == response
    assert item["loss_mask"].sum().item() == len(response)
    assert item["loss_mask"].tolist().index(1) == n_prompt


def test_message_list_prompt_and_plain_question_columns(tiny_data_dir, tok):
    path = os.path.join(tiny_data_dir, "sft_train.parquet")
    by_msgs = SFTDataset(path, tok, {"prompt_key": "prompt", "response_key": "answer", "max_length": 128})
    by_text = SFTDataset(path, tok, {"prompt_key": "question", "response_key": "answer", "max_length": 128})
    assert len(by_msgs) == 64
    assert by_msgs[5]["input_ids"].tolist() == by_text[5]["input_ids"].tolist()


def test_no_chat_template_option(tmp_path, tok):
    path = write(tmp_path, [{"prompt": "Q:", "response": "A"}])
    item = SFTDataset(path, tok, {**KEYS, "max_length": 4}, use_chat_template=False)[0]
    assert item["input_ids"].tolist() == [cid("Q"), cid(":"), cid("A"), 2]
    assert item["loss_mask"].tolist() == [0, 0, 1, 1]


def test_errors_name_the_culprit(tmp_path, tok):
    path = write(tmp_path, [{"prompt": "a", "extra": {"q": "x"}}])
    with pytest.raises(KeyError, match=r"'response'.*\['prompt', 'extra'\]"):
        SFTDataset(path, tok, KEYS)
    with pytest.raises(KeyError, match=r"row 0: extra has no key 'question'"):
        SFTDataset(path, tok, {**KEYS, "response_key": "extra", "response_dict_keys": ["question"]})
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        SFTDataset(str(tmp_path / "missing.parquet"), tok, KEYS)


def test_a_partial_section_takes_the_sft_trainer_defaults(tmp_path, tok):
    """Absent keys are SFTDataConfig's (sft_trainer.yaml): prompt_key question, and unknown keys are named."""
    path = write(tmp_path, [{"prompt": "a", "response": "b"}])
    with pytest.raises(KeyError, match=r"no column 'question' \(prompt_key\)"):
        SFTDataset(path, tok, {})
    with pytest.raises(ValueError, match=r"data.max_lenght is not a key of SFTDataConfig; did you mean max_length"):
        SFTDataset(path, tok, {**KEYS, "max_lenght": 8})
