"""The one PPO update loop (epochs -> mini-batches -> micro-batches) on a one-weight model whose
steps can be computed by hand: f(x) = w * x, squared error, token-mean over a mini-batch, SGD."""

import pytest
import torch

from hybridflow.algorithms import agg_loss
from hybridflow.config import FSDPActorConfig, FSDPOptimizerConfig
from hybridflow.protocol import DataProto
from hybridflow.workers.utils.update_loop import UpdateLoop

LR = 0.1
X = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [1.0, 1.0, 1.0], [2.0, 4.0, 0.0]])
Y = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [1.0, 1.0, 0.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])


def _settings(seed: int = 0, **overrides) -> FSDPActorConfig:
    """The schedule keys the loop reads, in the typed section it is handed (no gradient clipping)."""
    fields = dict(
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=1,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=64,
        ppo_epochs=1,
        shuffle=False,
        data_loader_seed=seed,
        optim=FSDPOptimizerConfig(clip_grad=None),
        loss_agg_mode="token-mean",
        loss_scale_factor=None,
    )
    return FSDPActorConfig(**{**fields, **overrides})


def _data() -> DataProto:
    return DataProto.from_dict(
        tensors={"x": X, "y": Y, "response_mask": MASK, "attention_mask": MASK, "row": torch.arange(4)}
    )


def _run(settings, seen_rows=None, step_constants=None):
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    loop = UpdateLoop(
        settings,
        model,
        torch.optim.SGD(model.parameters(), lr=LR),
        dp_group=None,
        prefix="toy",
        path="toy",
        max_token_len=settings.ppo_max_token_len_per_gpu,
    )

    def loss(micro, ctx):
        if seen_rows is not None:
            seen_rows.extend(micro.batch["row"].tolist())
        b = micro.batch
        per_token = (model.weight[0, 0] * b["x"] - b["y"]) ** 2
        value = agg_loss(per_token, b["response_mask"], "token-mean", **ctx.agg_kwargs())
        ctx.add("toy/loss", value)
        return value

    metrics = loop.run(_data(), loss, step_constants).to_floats()
    return model.weight.item(), metrics, loop


def _hand_sgd(row_groups) -> float:
    """w <- w - LR * d/dw mean over the group's valid tokens of (w x - y)^2 = 2 * mean((w x - y) x)."""
    w = 0.0
    for rows in row_groups:
        m = MASK[rows].bool()
        x, y = X[rows][m].double(), Y[rows][m].double()
        w -= LR * float((2 * (w * x - y) * x).mean())
    return w


@pytest.mark.parametrize("micro", [1, 2])
def test_one_step_per_mini_batch_equals_the_full_mini_batch_gradient(micro):
    w, metrics, _ = _run(
        _settings(ppo_micro_batch_size_per_gpu=micro, ppo_epochs=2), step_constants={"toy/constant": 7.0}
    )
    # 4 rows / mini-batch 2 = 2 steps per epoch, 2 epochs, rows in order (no shuffle)
    assert w == pytest.approx(_hand_sgd([[0, 1], [2, 3]] * 2), rel=1e-6)
    assert len(metrics["toy/grad_norm"]) == len(metrics["toy/skipped_steps"]) == 4
    assert metrics["toy/constant"] == [7.0] * 4  # logged once per optimizer step
    assert len(metrics["toy/loss"]) == 4  # the micro-batch shares add up to one value per step


def test_token_budget_cut_gives_the_same_step():
    fixed, _, _ = _run(_settings(ppo_micro_batch_size_per_gpu=2))
    # rows hold 2, 1, 3, 2 tokens: mini-batch [0, 1] is one micro-batch, [2, 3] two
    budget, _, _ = _run(_settings(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=3))
    assert budget == pytest.approx(fixed, rel=1e-6)


def test_shuffle_is_seeded_and_continues_across_updates():
    def order(seed):
        rows = []
        settings = _settings(
            shuffle=True, seed=seed, ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4, ppo_epochs=3
        )
        _run(settings, rows)
        return rows

    a, b, c = order(0), order(0), order(1)
    assert a == b and a != c
    epochs = [a[i : i + 4] for i in range(0, 12, 4)]
    assert all(sorted(e) == [0, 1, 2, 3] for e in epochs)  # each epoch is a permutation
    assert len({tuple(e) for e in epochs}) > 1  # one generator for the loop's life, not reseeded per epoch
