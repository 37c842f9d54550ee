"""Rollout dump format: rows by hand, the exact round trip, generation order, replay-file choice, settings."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.config import ConfigError, omega_conf_to_dataclass
from hybridflow.config.skip import RolloutSkipConfig, RolloutTqSkipConfig
from hybridflow.config.trainer import TrainerConfig
from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo import rollout_dump
from hybridflow.trainer.ppo.rollout_replay import RolloutRecorder, find_replay_file

TOK = build_tiny_tokenizer()  # the shared character tokenizer (hybridflow/models/tiny.py)
PAD, EOS = TOK.pad_token_id, TOK.eos_token_id  # specials, skipped when decoding
A, B, C, D, E, F, G, H = TOK.encode("abcdefgh", add_special_tokens=False)  # one id per character


def _obj(values):
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def _batch() -> DataProto:
    """Two samples, P=4, R=3, in the rollout layout (base.py's module docstring):
    row 0: prompt 'cd', response 'e' + EOS; row 1: prompt 'abc', response 'fgh' (cut)."""
    prompts = torch.tensor([[PAD, PAD, C, D], [PAD, A, B, C]])
    responses = torch.tensor([[E, EOS, PAD], [F, G, H]])
    attention = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1]])
    # prompt positions count real tokens (pads clipped to 0); the response continues from the last one
    positions = torch.tensor([[0, 0, 0, 1, 2, 3, 4], [0, 0, 1, 2, 3, 4, 5]])
    scores = torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, 0.25]])
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], -1),
            "attention_mask": attention,
            "position_ids": positions,
            "response_mask": attention[:, 4:].clone(),
            "rollout_log_probs": torch.tensor([[-0.1, -0.2, 0.0], [-1.5, -0.3, -0.7]]),
            "token_level_scores": scores,
            "advantages": torch.tensor([[0.7, 0.7, 0.0], [-0.7, -0.7, -0.7]]),
        },
        non_tensors={
            "uid": _obj(["1_0", "1_1"]),
            "index": _obj([11, 12]),
            "data_source": _obj(["toy", "toy"]),
            "reward_model": _obj([{"ground_truth": "5"}, {"ground_truth": "7"}]),
            "raw_prompt_ids": _obj([[C, D], [A, B, C]]),
        },
    )


def test_rows_carry_verl_fields_and_compact_token_ids():
    rows = rollout_dump.batch_to_rows(_batch(), TOK, step=3)
    r0, r1 = rows
    # veRL's fields
    assert (r0["input"], r0["output"], r0["gts"], r0["score"], r0["step"]) == ("cd", "e", "5", 0.5, 3)
    assert (r1["input"], r1["output"], r1["gts"], r1["score"]) == ("abc", "fgh", "7", 0.25)
    # token ids without padding; per-token tensors cut to the response's attention length (2 and 3)
    assert r0["prompt_ids"] == [C, D] and r0["response_ids"] == [E, EOS]
    assert (r0["prompt_width"], r0["response_width"]) == (4, 3)
    assert r0["response_mask"] == [1, 1] and r0["advantages"] == pytest.approx([0.7, 0.7])
    assert r1["response_ids"] == [F, G, H] and r1["token_level_scores"] == [0.0, 0.0, 0.25]
    assert r0["non_tensor"] == {
        "uid": "1_0",
        "index": 11,
        "data_source": "toy",
        "reward_model": {"ground_truth": "5"},
        "raw_prompt_ids": [C, D],
    }
    assert "padded" not in r0 and "padded" not in r1  # the rollout layout rebuilds both rows exactly
    json.dumps(rows)  # plain JSON


def test_round_trip_rebuilds_the_generated_tensors_exactly(tmp_path):
    batch = _batch()
    path = rollout_dump.write_rows(rollout_dump.step_file(str(tmp_path), 3), rollout_dump.batch_to_rows(batch, TOK, 3))
    assert path.endswith("/3.jsonl") and rollout_dump.dumped_steps(str(tmp_path)) == [3]
    back = rollout_dump.rows_to_batch(rollout_dump.read_rows(path), PAD)
    for key in (*rollout_dump.GENERATED_TENSORS, *rollout_dump.GENERATED_PER_TOKEN):
        assert torch.equal(back.batch[key], batch.batch[key]), key
        assert back.batch[key].dtype == batch.batch[key].dtype, key
    assert "advantages" not in back.batch.keys()  # later phases recompute it
    assert list(back.non_tensor_batch["uid"]) == ["1_0", "1_1"]
    assert back.non_tensor_batch["raw_prompt_ids"][1] == [A, B, C]  # lists stay lists (no 2-D object array)


def test_rows_the_layout_cannot_rebuild_are_stored_in_full():
    batch = _batch()
    batch.batch["position_ids"][1, 4:] = torch.tensor([9, 9, 9])  # an engine with other response positions
    batch.batch["responses"][0, 2] = EOS  # and one that pads with EOS
    batch.batch["input_ids"][0, 6] = EOS
    rows = rollout_dump.batch_to_rows(batch, TOK, 1)
    assert set(rows[0]["padded"]) == {"responses", "input_ids"} and set(rows[1]["padded"]) == {"position_ids"}
    back = rollout_dump.rows_to_batch(json.loads(json.dumps(rows)), PAD)
    for key in rollout_dump.GENERATED_TENSORS:
        assert torch.equal(back.batch[key], batch.batch[key]), key


def test_rows_are_written_in_generation_order_after_balancing():
    batch = _batch()
    order = [1, 0]  # the balancer put generated row 1 first
    batch.reorder(torch.tensor(order))
    batch.meta_info["balance_order"] = order
    rows = rollout_dump.batch_to_rows(batch, TOK, 1)
    assert [r["non_tensor"]["uid"] for r in rows] == ["1_0", "1_1"]


def test_replay_file_choice(tmp_path):
    d = str(tmp_path)
    for step in (2, 5):
        rollout_dump.write_rows(rollout_dump.step_file(d, step), [{"x": 1}])
    assert find_replay_file(d, 2, "cache").endswith("/2.jsonl")
    assert find_replay_file(d, 3, "cache") is None
    assert find_replay_file(d, 3, "repeat").endswith("/2.jsonl")  # the nearest earlier
    assert find_replay_file(d, 1, "repeat").endswith("/2.jsonl")  # none earlier: the nearest later
    assert find_replay_file(d, 9, "repeat").endswith("/5.jsonl")
    assert find_replay_file(str(tmp_path / "none"), 1, "repeat") is None


def test_read_rows_refuses_dumps_without_token_ids(tmp_path):
    path = tmp_path / "1.jsonl"
    path.write_text(json.dumps({"input": "q", "output": "a", "score": 1.0, "step": 1}) + "\n")
    with pytest.raises(ValueError, match="token ids"):
        rollout_dump.read_rows(str(path))


def _skip_config(**rollout):
    rollout = {"enable": True, "dump_dir": "/d", "steps": [1], "action": "cache", **rollout}
    return OmegaConf.create({"skip": {"rollout": rollout}})


def test_skip_section_refuses_what_would_silently_do_nothing():
    """skip.rollout is read as its typed section; enabled, the settings that would replay nothing are
    refused when it is built, naming the key."""
    skip = omega_conf_to_dataclass(_skip_config(dump_dir="~/dumps").skip.rollout, RolloutSkipConfig)
    recorder = RolloutRecorder(TOK, TrainerConfig(rollout_data_dir="~/rollouts"), skip, samples_per_prompt=2)
    assert recorder.skip.steps == [1] and recorder.samples_per_prompt == 2
    assert recorder.skip_dir.endswith("/dumps") and not recorder.skip_dir.startswith("~")  # ~ expanded
    assert recorder.rollout_data_dir == os.path.expanduser("~/rollouts") and recorder.validation_data_dir is None
    off = RolloutRecorder(TOK)
    assert not off.skip.enable and off.replay(None, 1, {}) is None and off.rollout_data_dir is None
    with pytest.raises(ConfigError, match=r"skip.rollout.steps=\[\]"):
        omega_conf_to_dataclass(_skip_config(steps=[]).skip.rollout, RolloutSkipConfig)
    with pytest.raises(ConfigError, match="skip.rollout.action='random'"):
        RolloutSkipConfig(enable=True, dump_dir="/d", steps=[1], action="random")
    with pytest.raises(ConfigError, match="skip.rollout.dump_dir"):
        RolloutSkipConfig(enable=True, dump_dir="", steps=[1])
    with pytest.raises(ConfigError, match=r"skip.rollout_tq.steps=\[\]"):  # the other places name themselves
        RolloutTqSkipConfig(enable=True, dump_dir="/d")
    assert RolloutSkipConfig(enable=False, dump_dir="", steps=[]).enable is False  # off: nothing to check
    with pytest.raises(ConfigError, match=r"skip.rollout.steps\[0\] must be an integer"):  # typed conversion
        omega_conf_to_dataclass(_skip_config(steps=["one"]).skip.rollout, RolloutSkipConfig, path="skip.rollout")
