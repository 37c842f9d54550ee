import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data.preprocess.gsm8k import INSTRUCTION, extract_solution, main, make_map_fn

TRAIN = [
    {"question": "Tom has 3 apples and buys 2. How many?", "answer": "He has 3+2=<<3+2=5>>5.\n#### 5"},
    {"question": "A car costs $1,200 and a bike $34. Total?", "answer": "1200+34=1234\n#### 1,234"},
]
TEST = [{"question": "It is 5 below 2. What is it?", "answer": "2-5=-3\n#### -3"}]


def write_hub_layout(root):
    os.makedirs(os.path.join(root, "main"))
    for split, rows in (("train", TRAIN), ("test", TEST)):
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(root, "main", f"{split}-00000-of-00001.parquet"))


def write_jsonl(root):
    os.makedirs(root)
    for split, rows in (("train", TRAIN), ("test", TEST)):
        with open(os.path.join(root, f"{split}.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")


def test_extract_solution_strips_commas_and_keeps_sign():
    assert extract_solution("... #### 1,234") == "1234"
    assert extract_solution("x\n#### -3") == "-3"
    assert extract_solution("#### 2.5 apples") == "2.5"
    with pytest.raises(ValueError, match="no '#### <number>'"):
        extract_solution("the answer is 4")


def test_map_fn_builds_the_rl_row():
    row = make_map_fn("train")(dict(TRAIN[1]), 7)
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": TRAIN[1]["question"] + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1234"},
        "extra_info": {"split": "train", "index": 7, "answer": TRAIN[1]["answer"], "question": TRAIN[1]["question"]},
    }
    assert INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'


@pytest.mark.parametrize("layout", [write_hub_layout, write_jsonl])
def test_main_converts_a_local_copy(tmp_path, layout):
    raw, out = str(tmp_path / "raw"), str(tmp_path / "out")
    layout(raw)
    written = main(["--local_dir", raw, "--local_save_dir", out])
    assert written == {s: os.path.join(out, f"{s}.parquet") for s in ("train", "test")}
    train = pq.read_table(written["train"]).to_pylist()
    test = pq.read_table(written["test"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in train] == ["5", "1234"]
    assert [r["extra_info"]["index"] for r in train] == [0, 1]
    assert test[0]["reward_model"]["ground_truth"] == "-3" and test[0]["extra_info"]["split"] == "test"


def test_missing_split_and_wrong_columns_are_named(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    with pytest.raises(FileNotFoundError, match="no 'train' split in .*raw"):
        main(["--local_dir", str(raw), "--local_save_dir", str(tmp_path / "o")])
    (raw / "train.jsonl").write_text(json.dumps({"problem": "x", "solution": "y"}) + "\n")
    with pytest.raises(KeyError, match=r"train\.jsonl.*\['question', 'answer'\].*\['problem', 'solution'\]"):
        main(["--local_dir", str(raw), "--local_save_dir", str(tmp_path / "o")])
    with pytest.raises(FileNotFoundError, match="nowhere"):
        main(["--local_dir", str(tmp_path / "nowhere")])
