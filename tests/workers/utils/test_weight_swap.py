"""``swapped_weights`` / ``parameters_at_rest`` (V1 separate_async's π_old): the swap computes with the
snapshot and gives the module its own weights back, also on an FSDP2 mesh after a no-grad forward, which
leaves FSDP2's root parameters gathered in their compute form."""

import copy

import pytest
import torch
from torch.distributed.tensor import DTensor

from hybridflow.workers.engine.fsdp import fully_shard_layers
from hybridflow.workers.utils.weight_swap import parameters_at_rest, swapped_weights
from tests.workers.actor.ppo_batch import tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

IDS = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))


def _logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _nudged(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)


def test_a_plain_module_computes_with_the_snapshot_and_gets_its_weights_back():
    model = tiny_causal_lm()
    old = copy.deepcopy(model)
    snapshot = [p.detach().clone() for p in parameters_at_rest(model)]
    _nudged(model)
    now = _logits(model)
    with swapped_weights(model, snapshot):
        assert torch.equal(_logits(model), _logits(old))
    assert torch.equal(_logits(model), now)
    with pytest.raises(ValueError, match="2 tensors for"):
        with swapped_weights(model, snapshot[:2]):
            pass


def test_on_an_fsdp2_mesh_after_a_no_grad_forward(one_rank_group):
    model = tiny_causal_lm()
    old = copy.deepcopy(model)
    fully_shard_layers(model)
    _logits(model)  # the root's parameters stay gathered after this
    snapshot = [p.detach().clone() for p in parameters_at_rest(model)]
    assert all(isinstance(t, DTensor) and t.dtype == torch.float32 for t in snapshot)
    _nudged(model)
    now = _logits(model)
    with swapped_weights(model, snapshot):  # a plain tensor among the parameters: copy_ refused the DTensor
        torch.testing.assert_close(_logits(model), _logits(old), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(_logits(model), now, rtol=0, atol=0)
