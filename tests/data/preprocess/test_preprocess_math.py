import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data.preprocess.math import INSTRUCTION, extract_solution, main, make_map_fn

TRAIN = [
    {
        "problem": "What is $1/2 + 0$?",
        "solution": "We get $\\boxed{\\frac{1}{2}}$.",
        "level": "Level 1",
        "type": "Algebra",
    },
    {
        "problem": "Solve x+1=3.",
        "solution": "First \\boxed{1}? No: $x = \\boxed{2}$.",
        "level": "Level 2",
        "type": "Algebra",
    },
]
TEST = [{"problem": "Compute 2^3.", "solution": "$2^3 = \\boxed 8$", "level": "Level 1", "type": "Prealgebra"}]


def test_extract_solution_takes_the_last_box_with_nested_braces():
    assert extract_solution(TRAIN[0]["solution"]) == "\\frac{1}{2}"
    assert extract_solution(TRAIN[1]["solution"]) == "2"
    assert extract_solution("so \\fbox{x^{2}} holds") == "x^{2}"
    with pytest.raises(ValueError, match="no \\\\boxed"):
        extract_solution("the answer is 4")


def test_map_fn_builds_the_rl_row():
    row = make_map_fn("test")(dict(TRAIN[0]), 3)
    assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval" and row["ability"] == "math"
    assert row["prompt"] == [{"role": "user", "content": TRAIN[0]["problem"] + " " + INSTRUCTION}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "\\frac{1}{2}"}
    assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == 3
    assert row["extra_info"]["level"] == "Level 1" and row["extra_info"]["answer"] == TRAIN[0]["solution"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_main_converts_a_local_copy(tmp_path, fmt):
    raw, out = tmp_path / "raw", str(tmp_path / "out")
    (raw / "data").mkdir(parents=True)
    for split, rows in (("train", TRAIN), ("test", TEST)):
        if fmt == "parquet":  # the hub's layout for MATH-lighteval
            pq.write_table(pa.Table.from_pylist(rows), str(raw / "data" / f"{split}-00000-of-00001.parquet"))
        else:
            (raw / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = main(["--local_dir", str(raw), "--local_save_dir", out])
    train = pq.read_table(written["train"]).to_pylist()
    test = pq.read_table(written["test"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in train] == ["\\frac{1}{2}", "2"]
    assert test[0]["reward_model"]["ground_truth"] == "8"
