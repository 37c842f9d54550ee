import os
import re

import pyarrow.parquet as pq
import pytest

from hybridflow.data.tiny_task import INSTRUCTION, generate_splits, main, write_tiny_task


def test_rows_are_correct_gsm8k_style_problems():
    train, test = generate_splits(seed=0, train_size=300, test_size=100)
    assert len(train) == 300 and len(test) == 100
    for split, rows in (("train", train), ("test", test)):
        for i, r in enumerate(rows):
            assert r["data_source"] == "openai/gsm8k" and r["ability"] == "math"
            (msg,) = r["prompt"]
            assert msg["role"] == "user"
            assert msg["content"] == f"{r['extra_info']['question']} {INSTRUCTION}"
            assert len(msg["content"]) < 90  # every character is a token
            assert r["extra_info"]["split"] == split and r["extra_info"]["index"] == i
            # independent check: evaluate the worked step and compare with both answers
            m = re.fullmatch(r"(\d\d)([+-])(\d\d)=(\d+)\n#### (\d+)", r["extra_info"]["answer"])
            assert m, r["extra_info"]["answer"]
            a, op, b, res, final = int(m[1]), m[2], int(m[3]), int(m[4]), m[5]
            assert res == (a + b if op == "+" else a - b) >= 0
            assert final == str(res) == r["reward_model"]["ground_truth"]
            assert r["reward_model"]["style"] == "rule"
            # the numbers in the question are the operands
            assert re.findall(r"\d+", r["extra_info"]["question"]) == [str(a), str(b)]
    ops = {r["extra_info"]["answer"][2] for r in train}
    assert ops == {"+", "-"}


def test_train_and_test_questions_are_disjoint_and_unique():
    train, test = generate_splits(seed=1, train_size=500, test_size=200)
    tq = {r["extra_info"]["question"] for r in train}
    sq = {r["extra_info"]["question"] for r in test}
    assert len(tq) == 500 and len(sq) == 200 and not (tq & sq)


def test_test_split_depends_only_on_seed_and_test_size():
    _, test_a = generate_splits(seed=3, train_size=10, test_size=20)
    _, test_b = generate_splits(seed=3, train_size=50, test_size=20)
    assert test_a == test_b


def test_same_seed_gives_identical_parquet_and_other_seed_differs(tmp_path):
    a = write_tiny_task(str(tmp_path / "a"), seed=7, train_size=40, test_size=10)
    b = write_tiny_task(str(tmp_path / "b"), seed=7, train_size=40, test_size=10)
    c = write_tiny_task(str(tmp_path / "c"), seed=8, train_size=40, test_size=10)
    assert set(a) == {"train", "test", "sft_train", "sft_test"}
    for name in a:
        ta, tb = pq.read_table(a[name]), pq.read_table(b[name])
        assert ta.equals(tb)
        assert open(a[name], "rb").read() == open(b[name], "rb").read()
    assert not pq.read_table(a["train"]).equals(pq.read_table(c["train"]))


def test_sft_files_have_question_and_answer_columns(tmp_path):
    paths = write_tiny_task(str(tmp_path), seed=0, train_size=8, test_size=4)
    rows = pq.read_table(paths["sft_train"]).to_pylist()
    assert len(rows) == 8
    for r in rows:
        assert r["question"] == r["prompt"][0]["content"]  # the exact prompt RL sees
        assert r["answer"] == r["extra_info"]["answer"]
        assert r["answer"].endswith("#### " + r["reward_model"]["ground_truth"])
    rl = pq.read_table(paths["train"]).to_pylist()
    assert [r["prompt"] for r in rl] == [r["prompt"] for r in rows]
    assert set(pq.read_table(paths["train"]).column_names) == {
        "data_source",
        "prompt",
        "ability",
        "reward_model",
        "extra_info",
    }


def test_cli_writes_data_and_model(tmp_path, capsys):
    data, model = str(tmp_path / "data"), str(tmp_path / "model")
    main(["--data_dir", data, "--model_dir", model, "--seed", "0", "--train_size", "6", "--test_size", "3"])
    assert pq.read_table(os.path.join(data, "train.parquet")).num_rows == 6
    assert pq.read_table(os.path.join(data, "test.parquet")).num_rows == 3
    assert os.path.exists(os.path.join(model, "model.safetensors"))
    assert "6 train / 3 test" in capsys.readouterr().out


def _check_steps(a: int, b: int, op: str, text: str) -> None:
    """Independent reading of a 'steps' solution: every written equation holds, the digits are the
    operands' columns, and the final number is the true result."""
    ones, tens, final = re.fullmatch(r"(.+?), (.+?), so (\d+)", text).groups()
    for eq in (ones, tens):
        lhs, rhs = eq.split("=")
        assert eval(lhs) == int(rhs), (a, op, b, text)  # noqa: S307 - digits and +/- only
    assert int(final) == (a + b if op == "+" else a - b)
    ones_lhs, tens_lhs = ones.split("=")[0], tens.split("=")[0]
    assert ones_lhs.endswith(f"{op}{b % 10}") and ones_lhs[:-2] in (str(a % 10), f"1{a % 10}")
    assert tens_lhs.startswith(f"{a // 10}{op}{b // 10}")
    carried = ones_lhs[:-2] == f"1{a % 10}" if op == "-" else int(ones.split("=")[1]) >= 10
    tens_terms = tens_lhs.split(op)
    assert (tens_terms[2:] == ["1"]) == carried and len(tens_terms) in (2, 3)  # the carry/borrow moves to the tens


def test_digit_steps_hold_for_every_operand_pair():
    from hybridflow.data.tiny_task import digit_steps

    for a in range(10, 100):
        for b in range(10, 100):
            _check_steps(a, b, "+", digit_steps(a, b, "+"))
            if a >= b:
                _check_steps(a, b, "-", digit_steps(a, b, "-"))
    assert digit_steps(56, 19, "+") == "6+9=15, 5+1+1=7, so 75"
    assert digit_steps(56, 19, "-") == "16-9=7, 5-1-1=3, so 37"


def test_steps_style_rows_end_in_the_answer_and_keep_the_questions(tmp_path):
    direct_train, direct_test = generate_splits(seed=4, train_size=50, test_size=20)
    steps_train, steps_test = generate_splits(seed=4, train_size=50, test_size=20, style="steps")
    assert len(direct_train + direct_test) == len(steps_train + steps_test) == 70
    for d, s in zip(direct_train + direct_test, steps_train + steps_test, strict=True):
        assert d["prompt"] == s["prompt"] and d["reward_model"] == s["reward_model"]  # same problems
        m = re.fullmatch(r"(\d\d)([+-])(\d\d)=\d+\n#### \d+", d["extra_info"]["answer"])
        body, final = s["extra_info"]["answer"].split("\n#### ")
        assert final == s["reward_model"]["ground_truth"]
        _check_steps(int(m[1]), int(m[3]), m[2], body)
    with pytest.raises(ValueError, match="solution style 'cot'"):
        write_tiny_task(str(tmp_path), style="cot")
