"""Pure pieces of the rollout layer: response mask, padding, sampling resolution, the registry."""

from __future__ import annotations

import pytest
import torch

from hybridflow.workers.rollout import ROLLOUT_ENGINES, BaseRollout, HFRollout, VLLMRollout, get_rollout_class
from hybridflow.workers.rollout.base import pad_responses, register_rollout, response_mask_through_eos
from hybridflow.workers.rollout.sampling import SamplingParams, as_id_list, resolve_sampling, sampling_params_from_config


def test_response_mask_hand_examples():
    responses = torch.tensor(
        [
            [5, 2, 0, 0],  # EOS at 1 -> 1 through it, 0 after
            [5, 6, 7, 8],  # no EOS (cut by length) -> all 1
            [2, 2, 2, 2],  # pad == eos: only the first EOS counts as response
            [7, 9, 2, 9],  # tokens after the EOS are masked whatever they are
        ]
    )
    assert response_mask_through_eos(responses, [2]).tolist() == [
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
        [1, 1, 1, 0],
    ]
    # several EOS ids: the first of any of them ends the row
    assert response_mask_through_eos(responses, [2, 6]).tolist()[1] == [1, 1, 0, 0]
    # no EOS ids (ignore_eos): all 1, except past what the engine produced
    assert response_mask_through_eos(responses, []).tolist() == [[1] * 4] * 4
    lengths = torch.tensor([4, 2, 4, 3])
    assert response_mask_through_eos(responses, [2], valid_lengths=lengths).tolist() == [
        [1, 1, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 0, 0],
        [1, 1, 1, 0],
    ]
    assert response_mask_through_eos(responses, [2]).dtype == torch.long


def test_pad_responses():
    x = torch.tensor([[1, 2], [3, 4]])
    assert pad_responses(x, 4, 9).tolist() == [[1, 2, 9, 9], [3, 4, 9, 9]]
    assert pad_responses(x, 1, 9).tolist() == [[1], [3]]
    assert torch.equal(pad_responses(x, 2, 9), x)


def test_sampling_params_from_config_and_meta_overrides():
    config = {
        "temperature": 0.7, "top_k": 20, "top_p": 0.9, "do_sample": True, "response_length": 16,
        "val_kwargs": {"temperature": 0, "top_k": -1, "top_p": 1.0, "do_sample": False, "n": 1},
        "gpu_memory_utilization": 0.5,  # unrelated keys are ignored
    }
    train, val = sampling_params_from_config(config)
    assert train == SamplingParams(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, response_length=16)
    # validation keeps response_length from training, everything else from val_kwargs
    assert val == SamplingParams(do_sample=False, temperature=0.0, top_k=-1, top_p=1.0, response_length=16)
    assert not train.greedy and val.greedy
    assert resolve_sampling(train, val, {}) == train
    assert resolve_sampling(train, val, {"validate": True}) == val
    # meta_info overrides win over both; None means "not overridden"
    p = resolve_sampling(train, val, {"validate": True, "do_sample": True, "temperature": 1.0, "top_k": None})
    assert (p.do_sample, p.temperature, p.top_k) == (True, 1.0, -1)
    assert resolve_sampling(train, val, {"temperature": 0}).greedy
    assert resolve_sampling(train, val, {"response_length": 3}).response_length == 3


def test_sampling_params_accept_dictconfig():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"response_length": "${len}", "len": 12, "val_kwargs": {"do_sample": False}})
    train, val = sampling_params_from_config(cfg)
    assert train.response_length == 12 and val.greedy


def test_as_id_list():
    assert as_id_list(2) == [2]
    assert as_id_list([2, 3]) == [2, 3]
    assert as_id_list(None) == []


def test_registry_lists_engines():
    assert {"hf", "vllm"} <= set(ROLLOUT_ENGINES.names())
    assert get_rollout_class("hf") is HFRollout
    assert get_rollout_class("vllm") is VLLMRollout
    with pytest.raises(KeyError, match="hf"):  # an unknown name lists the known ones
        get_rollout_class("sglang")
    register_rollout("hf")(HFRollout)  # the same class again is fine (veRL's registries allow it)
    with pytest.raises(ValueError):  # a different class under a taken name is an error
        register_rollout("hf")(VLLMRollout)
    assert get_rollout_class("hf") is HFRollout


def test_user_engine_can_register():
    class EchoRollout(BaseRollout):
        def generate_sequences(self, prompts):
            return prompts

        def load_weights(self, named_tensors):
            return 0

    register_rollout("echo_test")(EchoRollout)
    try:
        assert get_rollout_class("echo_test") is EchoRollout
        EchoRollout().sleep()  # sleep / wake_up default to no-ops
        EchoRollout().wake_up()
    finally:
        ROLLOUT_ENGINES._entries.pop("echo_test")


def test_shipped_rollout_config_section_parses():
    import os

    from omegaconf import OmegaConf

    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs", "ppo_trainer.yaml")
    if not os.path.exists(path):
        pytest.skip("configs/ppo_trainer.yaml not written yet")
    root = OmegaConf.load(path)
    section = root.actor_rollout_ref.rollout
    train, val = sampling_params_from_config(section)
    assert train.response_length == root.data.max_response_length
    assert train.do_sample and not train.ignore_eos
    assert val.greedy and val.response_length == train.response_length
