"""main_generation → main_eval on the tiny model, pass@k against brute force, greedy accuracy."""

from __future__ import annotations

import itertools
import math
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybridflow.trainer.eval_utils import greedy_accuracy, ks_for, pass_at_k, summarize_scores

# ------------------------------------------------------------------------------------------- pass@k


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 1, 1), (5, 2, 2), (6, 3, 4), (4, 4, 3), (7, 2, 7), (8, 5, 3)])
def test_pass_at_k_matches_brute_force(n, c, k):
    # reference: enumerate every k-subset of n samples (c correct) and count subsets with a correct one
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_hand_values_and_errors():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # one of four correct, one draw
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]


def test_summarize_scores_per_source():
    # source a: prompts with scores [1,0] and [0,0] -> mean 0.25, pass@1 = (0.5+0)/2, pass@2 = (1+0)/2
    # source b: one prompt [1,1] -> mean 1, pass@1 = pass@2 = 1
    out = summarize_scores(["a", "a", "b"], [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    assert out == pytest.approx(
        {"a/mean_score": 0.25, "a/pass@1": 0.25, "a/pass@2": 0.5, "b/mean_score": 1.0, "b/pass@1": 1.0, "b/pass@2": 1.0}
    )


# ------------------------------------------------------------------------------------------- main_eval


def _write(rows, path):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_main_eval_builtin_gsm8k_scorer(tmp_path, capsys):
    from hybridflow.main_eval import main

    gt = lambda v: {"style": "rule", "ground_truth": v}  # noqa: E731
    rows = [
        # 2 of 3 right (strict "#### N") -> pass@1 = 2/3, pass@2 = 1 - C(1,2)/C(3,2) = 1
        {
            "data_source": "openai/gsm8k",
            "reward_model": gt("12"),
            "prompt": "p0",
            "responses": ["5+7=12\n#### 12", "#### 13", "#### 12"],
        },
        # none right (no "####" at all scores 0 too)
        {
            "data_source": "openai/gsm8k",
            "reward_model": gt("7"),
            "prompt": "p1",
            "responses": ["#### 8", "7", "#### 9"],
        },
    ]
    path = _write(rows, tmp_path / "gen.parquet")
    metrics = main([f"data.path={path}"])
    assert metrics["openai/gsm8k/mean_score"] == pytest.approx(2 / 6)
    assert metrics["openai/gsm8k/pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert metrics["openai/gsm8k/pass@2"] == pytest.approx((1 + 0) / 2)
    assert metrics["openai/gsm8k/pass@3"] == pytest.approx(0.5)
    assert "openai/gsm8k/pass@1: 0.3333" in capsys.readouterr().out


def test_main_eval_custom_reward_function(tmp_path):
    from hybridflow.main_eval import main

    reward = tmp_path / "reward.py"
    reward.write_text(
        "def my_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(len(solution_str) == int(ground_truth)), 'len': len(solution_str)}\n"
    )
    rows = [{"data_source": "toy", "reward_model": {"ground_truth": "2"}, "prompt": "p", "responses": ["ab", "abc"]}]
    path = _write(rows, tmp_path / "gen.parquet")
    metrics = main(
        [f"data.path={path}", f"custom_reward_function.path={reward}", "custom_reward_function.name=my_score"]
    )
    assert metrics == pytest.approx({"toy/mean_score": 0.5, "toy/pass@1": 0.5, "toy/pass@2": 1.0})


# ------------------------------------------------------------------------------------------- generation


def _direct_greedy(model_dir, prompt_messages, max_new_tokens):
    """Independent reference: transformers generate on one unpadded prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    text = tok.apply_chat_template(prompt_messages, add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            top_k=None,
            top_p=None,
        )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def _gen_args(model_dir, data_path, out_path, extra=()):
    return [
        f"model.path={model_dir}",
        f"data.path={data_path}",
        f"data.output_path={out_path}",
        "data.batch_size=2",
        "rollout.prompt_length=128",
        "rollout.response_length=6",
        "trainer.backend=inprocess",
        "trainer.device=cpu",
        *extra,
    ]


def test_generation_then_eval_on_tiny_model(tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.main_eval import main as eval_main
    from hybridflow.main_generation import main as gen_main

    rows = pq.read_table(os.path.join(tiny_data_dir, "test.parquet")).to_pylist()[:3]
    data = _write(rows, tmp_path / "in.parquet")
    out = gen_main(
        _gen_args(
            tiny_model_dir,
            data,
            tmp_path / "sampled.parquet",
            ["data.n_samples=3", "rollout.temperature=1.0", "rollout.top_k=-1", "rollout.top_p=1.0"],
        )
    )
    table = pq.read_table(out).to_pylist()
    assert len(rows) == len(table) == 3
    for src, row in zip(rows, table, strict=True):
        assert len(row["responses"]) == 3 and all(isinstance(r, str) for r in row["responses"])
        assert row["reward_model"] == src["reward_model"] and row["prompt"] == src["prompt"]  # inputs kept, in order
    metrics = eval_main([f"data.path={out}"])
    # a random model: scores exist and are probabilities; pass@k grows with k
    assert set(metrics) == {
        "openai/gsm8k/mean_score",
        "openai/gsm8k/pass@1",
        "openai/gsm8k/pass@2",
        "openai/gsm8k/pass@3",
    }
    assert all(0.0 <= v <= 1.0 and math.isfinite(v) for v in metrics.values())
    assert metrics["openai/gsm8k/pass@1"] <= metrics["openai/gsm8k/pass@2"] <= metrics["openai/gsm8k/pass@3"]


def test_greedy_generation_matches_transformers(tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.main_generation import main as gen_main

    rows = pq.read_table(os.path.join(tiny_data_dir, "test.parquet")).to_pylist()[:3]  # different prompt lengths
    data = _write(rows, tmp_path / "in.parquet")
    out = gen_main(
        _gen_args(tiny_model_dir, data, tmp_path / "greedy.parquet", ["data.n_samples=2", "rollout.do_sample=False"])
    )
    table = pq.read_table(out).to_pylist()
    assert len(rows) == len(table) == 3  # an empty or short output must not pass
    for src, row in zip(rows, table, strict=True):
        expected = _direct_greedy(tiny_model_dir, src["prompt"], 6)
        assert row["responses"] == [expected, expected]  # left padding in a batch changes nothing


def test_greedy_accuracy_counts_scorer_hits(tiny_model_dir, tiny_data_dir):
    # the scorer is told every response is right for odd ground truths only: accuracy = share of odd answers
    rows = pq.read_table(os.path.join(tiny_data_dir, "test.parquet")).to_pylist()[:5]
    odd = sum(int(r["reward_model"]["ground_truth"]) % 2 for r in rows) / 5
    acc, samples = greedy_accuracy(
        tiny_model_dir,
        os.path.join(tiny_data_dir, "test.parquet"),
        limit=5,
        response_length=4,
        batch_size=3,
        return_samples=2,
        compute_score=lambda ds, s, gt, extra=None: float(int(gt) % 2),
    )
    assert acc == pytest.approx(odd) and len(samples) == 2
    # the real gsm8k scorer on a random model: nothing is right
    assert (
        greedy_accuracy(tiny_model_dir, os.path.join(tiny_data_dir, "test.parquet"), limit=4, response_length=4) == 0.0
    )


def test_a_ray_timeline_is_refused_without_ray_workers(tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.config.loader import ConfigError
    from hybridflow.main_generation import main as gen_main

    out = tmp_path / "never.parquet"
    args = _gen_args(tiny_model_dir, os.path.join(tiny_data_dir, "test.parquet"), out)
    with pytest.raises(ConfigError, match="ray_kwargs.timeline_json_file=.*trainer.backend=inprocess"):
        gen_main([*args, f"ray_kwargs.timeline_json_file={tmp_path / 't.json'}"])
    assert not out.exists()


def test_veRLs_generation_server_command_line_writes_the_same_greedy_responses(tiny_model_dir, tiny_data_dir, tmp_path):
    """veRL 0.9.1's ``main_generation_server`` keys (its examples/generation script): ppo_trainer's rollout and
    data keys, the output added with +, several input files read in order."""
    from hybridflow.config.errors import ConfigError
    from hybridflow.main_generation_server import main as server_main

    rows = pq.read_table(os.path.join(tiny_data_dir, "test.parquet")).to_pylist()[:3]
    first, second = _write(rows[:2], tmp_path / "a.parquet"), _write(rows[2:], tmp_path / "b.parquet")
    args = [
        f"data.train_files=[{first},{second}]",
        "data.prompt_key=prompt",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.temperature=0",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.rollout.prompt_length=128",
        "actor_rollout_ref.rollout.response_length=6",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "trainer.backend=inprocess",
        "trainer.device=cpu",
    ]
    out = server_main([*args, f"+data.output_path={tmp_path / 'gen.parquet'}"])
    table = pq.read_table(out).to_pylist()
    assert [r["prompt"] for r in table] == [r["prompt"] for r in rows]  # both files, in order
    for src, row in zip(rows, table, strict=True):
        assert row["responses"] == [_direct_greedy(tiny_model_dir, src["prompt"], 6)]
    with pytest.raises(ConfigError, match=r"needs \+data.output_path=FILE"):
        server_main(args)
    with pytest.raises(ConfigError, match="temperature=0 samples one response"):
        server_main([*args, "actor_rollout_ref.rollout.n=2", f"+data.output_path={tmp_path / 'x.parquet'}"])
