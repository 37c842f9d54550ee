import copy

import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.workers.critic import DataParallelPPOCritic
from tests.workers.actor.ppo_batch import tiny_value_model

VOCAB, P, R = 16, 6, 5
PROMPT_LENS = [6, 3, 1, 4, 2, 5, 6, 1]
RESPONSE_LENS = [5, 2, 4, 1, 3, 5, 1, 2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _data(seed=0):
    prompt_lens, response_lens = torch.tensor(PROMPT_LENS), torch.tensor(RESPONSE_LENS)
    response_mask = (torch.arange(R) < response_lens[:, None]).long()  # (B, R)
    attention_mask = torch.cat([(torch.arange(P) >= P - prompt_lens[:, None]).long(), response_mask], dim=1)
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, attention_mask.shape, generator=gen) * attention_mask
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": input_ids[:, P:],
            "returns": torch.randn(response_mask.shape, generator=gen) * response_mask,
        },
        meta_info={"temperature": 1.0},
    )


def _config(**overrides):
    from tests.yaml_sections import critic

    return critic(
        **{
            "ppo_mini_batch_size": 8,
            "ppo_micro_batch_size_per_gpu": 8,
            "forward_micro_batch_size_per_gpu": 3,
            "use_dynamic_bsz": False,
            "ppo_max_token_len_per_gpu": 16,
            "forward_max_token_len_per_gpu": 16,
            "ppo_epochs": 1,
            "shuffle": False,
            "grad_clip": None,
            "cliprange_value": 10.0,
            "loss_agg_mode": "token-mean",
            **overrides,
        }
    )


def test_values_are_the_value_before_each_response_token():
    model = tiny_value_model().eval()
    data = _data()
    values = DataParallelPPOCritic(_config(), model).compute_values(data)
    assert values.shape == (8, R)
    mask = data.batch["attention_mask"][:, P:].bool()
    assert (values[~mask] == 0).all()
    # Reference: each row unpadded; the value before response token j is the head's output at the
    # last token before it, i.e. unpadded position prompt_len - 1 + j.
    for b, (pl, rl) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        tokens = data.batch["input_ids"][b][data.batch["attention_mask"][b].bool()]
        with torch.no_grad():
            out = model(input_ids=tokens[None]).logits[0, :, 0]  # (pl + rl,)
        torch.testing.assert_close(values[b, :rl], out[pl - 1 : pl - 1 + rl], atol=1e-5, rtol=1e-5)
    # same values with token-budget micro-batches (order restored)
    data.meta_info.update(use_dynamic_bsz=True, max_token_len=12)
    torch.testing.assert_close(DataParallelPPOCritic(_config(), model).compute_values(data), values, atol=1e-5, rtol=0)


def test_update_reduces_value_loss_and_is_micro_batch_invariant():
    base = tiny_value_model()
    data = _data()
    data.batch["values"] = DataParallelPPOCritic(_config(), base).compute_values(data)

    finals = []
    for split in (
        {"ppo_micro_batch_size_per_gpu": 8},
        {"ppo_micro_batch_size_per_gpu": 1},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 12},
    ):
        model = copy.deepcopy(base)
        critic = DataParallelPPOCritic(
            _config(ppo_epochs=2, **split), model, torch.optim.SGD(model.parameters(), lr=0.1)
        )
        metrics = critic.update_critic(data)
        assert sorted(metrics) == [
            "critic/grad_norm",
            "critic/skipped_steps",
            "critic/vf_clipfrac",
            "critic/vf_loss",
            "critic/vpred_mean",
        ]
        finals.append((torch.cat([p.detach().reshape(-1) for p in model.parameters()]), metrics))
    for params, metrics in finals[1:]:
        assert (params - finals[0][0]).abs().max() < 1e-5
        assert metrics["critic/vf_loss"] == pytest.approx(finals[0][1]["critic/vf_loss"], abs=1e-6)

    # a few more steps on the same batch keep reducing the loss
    model = copy.deepcopy(base)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    critic = DataParallelPPOCritic(_config(ppo_epochs=10), model, optimizer, scheduler)
    metrics = critic.update_critic(data)
    losses = metrics["critic/vf_loss"]
    assert losses[-1] < 0.5 * losses[0]
    assert metrics["critic/lr"] == [1e-2]
    # vf_loss is 0.5 * token-mean squared error at the start (values == predictions before the step)
    mask = data.batch["attention_mask"][:, P:].float()
    expected = 0.5 * (((data.batch["values"] - data.batch["returns"]) ** 2) * mask).sum() / mask.sum()
    assert losses[0] == pytest.approx(expected.item(), rel=1e-5)
