"""Ulysses sequence parallelism on two gloo ranks: the exchanges against hand-built expectations,
and SP=2 against SP=1 (the same data on one process) for the tiny model's log-probs, values and
gradients, packed (remove-padding), with fixed micro-batches and with token budgets."""

import copy
import gc
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from hybridflow.models.tiny import build_tiny_config, build_tiny_model
from hybridflow.single_controller.base.worker import find_free_port
from hybridflow.workers.actor import DataParallelPPOActor
from hybridflow.workers.critic import DataParallelPPOCritic
from hybridflow.workers.utils.ulysses import all_to_all, build_layout, gather_seq, layout_of
from hybridflow.workers.utils.ulysses_attention import packed_causal_mask, use_ulysses_attention
from tests.workers.actor.ppo_batch import SIZE, VOCAB, actor_config, ppo_batch, tiny_causal_lm, tiny_value_model

SP = 2
PROMPT_LENS = [6, 3, 1, 4, 2, 5, 6, 1]
RESPONSE_LENS = [5, 2, 4, 1, 3, 5, 1, 2]
ACTOR_VARIANTS = {
    "fixed": {"ppo_micro_batch_size_per_gpu": 3},
    # SP=2 packs micro-batches of up to 2 x 12 tokens, SP=1 of 12: different splits, same step
    "dynamic": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 12},
    # the recomputed layers in backward must run the SP attention again (its arguments ride in the kwargs)
    "checkpointing": {"ppo_micro_batch_size_per_gpu": 3, "checkpointing": True},
}

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _actor_config(**overrides):
    return actor_config(
        ppo_mini_batch_size=8,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        use_remove_padding=True,
        **overrides,
    )


def _critic_config(**overrides):
    from tests.yaml_sections import critic

    return critic(
        **{
            "ppo_mini_batch_size": 8,
            "ppo_micro_batch_size_per_gpu": 3,
            "forward_micro_batch_size_per_gpu": 3,
            "use_dynamic_bsz": False,
            "ppo_max_token_len_per_gpu": 16,
            "forward_max_token_len_per_gpu": 16,
            "ppo_epochs": 1,
            "shuffle": False,
            "grad_clip": None,
            "cliprange_value": 10.0,
            "loss_agg_mode": "token-mean",
            "use_remove_padding": True,
            **overrides,
        }
    )


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it steps with (the update loop zeroes them after)."""

    def __init__(self, model):
        self.names = [n for n, _ in model.named_parameters()]
        super().__init__(model.parameters(), lr=0.1)
        self.grads = None

    def step(self, closure=None):
        params = self.param_groups[0]["params"]
        missing = [n for n, p in zip(self.names, params) if p.grad is None]
        assert not missing, f"no gradient for {missing}"
        self.grads = {n: p.grad.detach().clone() for n, p in zip(self.names, params)}
        return super().step(closure)


def _log_prob_meta(data, variant):
    data = copy.copy(data)
    data.meta_info = {
        **data.meta_info,
        "micro_batch_size": 3,
        "use_dynamic_bsz": variant == "dynamic",
        "max_token_len": 12,
    }
    return data


def _exchanges(sp, rank: int) -> dict:
    """all_to_all and gather_seq with values that name their origin: 100*rank + 10*head + position."""
    heads, local = 4, 3
    x = (100 * rank + 10 * torch.arange(heads)[:, None] + torch.arange(local)[None]).float()
    x = x.reshape(1, heads, local, 1).requires_grad_()
    y = all_to_all(x, sp, scatter_dim=1, gather_dim=2)  # (1, heads/2, 2*local, 1)
    w = (1000 * rank + 10 * torch.arange(heads // SP)[:, None] + torch.arange(SP * local)[None]).float()
    (y * w.reshape(y.shape)).sum().backward()
    z = (torch.arange(3.0) + 10 * rank).requires_grad_()
    g = gather_seq(z, sp, dim=0)
    (g * torch.arange(6.0)).sum().backward()
    return {"a2a": y.detach(), "a2a_grad": x.grad, "gather": g.detach(), "gather_grad": z.grad}


def _actor_runs(layout) -> dict:
    base = tiny_causal_lm()
    data = ppo_batch(base, batch_size=8, prompt_lens=PROMPT_LENS, response_lens=RESPONSE_LENS)
    out = {}
    for variant, overrides in ACTOR_VARIANTS.items():
        overrides = dict(overrides)
        checkpointing = overrides.pop("checkpointing", False)
        config = _actor_config(**overrides)
        ref_model = copy.deepcopy(base)
        ref = DataParallelPPOActor(config, ref_model, RecordingSGD(ref_model), dp_group=layout.dp_group)
        sp_module = copy.deepcopy(base)
        use_ulysses_attention(sp_module, SP, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")
        if checkpointing:
            sp_module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        sp_model = DistributedDataParallel(sp_module)
        actor = DataParallelPPOActor(config, sp_model, RecordingSGD(sp_module), dp_group=layout.dp_group, sp=layout.sp)
        for name, runner in (("sp1", ref), ("sp2", actor)):
            log_probs, entropy = runner.compute_log_prob(_log_prob_meta(data, variant), calculate_entropy=True)
            metrics = runner.update_policy(data)
            out[f"{variant}/{name}"] = {
                "log_probs": log_probs,
                "entropy": entropy,
                "grads": runner.actor_optimizer.grads,
                "pg_loss": metrics["actor/pg_loss"],
                "kl_loss": metrics["actor/kl_loss"],
            }
        del sp_model, actor
    # key/value heads that do not divide by SP (1 here) are repeated to 2
    config = build_tiny_config(VOCAB, tie_word_embeddings=False, **{**SIZE, "num_kv_heads": 1})
    one_kv = build_tiny_model(config, seed=3)
    plain = DataParallelPPOActor(_actor_config(ppo_micro_batch_size_per_gpu=3), one_kv, dp_group=layout.dp_group)
    sp_module = copy.deepcopy(one_kv)
    use_ulysses_attention(sp_module, SP, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    sharded = DataParallelPPOActor(
        _actor_config(ppo_micro_batch_size_per_gpu=3), sp_module, dp_group=layout.dp_group, sp=layout.sp
    )
    out["one_kv_head"] = [runner.compute_log_prob(_log_prob_meta(data, "fixed"))[0] for runner in (plain, sharded)]
    return out


def _critic_runs(layout) -> dict:
    base = tiny_value_model()
    data = ppo_batch(tiny_causal_lm(), batch_size=8, prompt_lens=PROMPT_LENS, response_lens=RESPONSE_LENS)
    gen = torch.Generator().manual_seed(5)
    data.batch["returns"] = torch.randn(data.batch["responses"].shape, generator=gen)
    out = {}
    for name in ("sp1", "sp2"):
        module = copy.deepcopy(base)
        if name == "sp2":
            use_ulysses_attention(module, SP, "critic.ulysses_sequence_parallel_size")
            module = DistributedDataParallel(module)
        optimizer = RecordingSGD(getattr(module, "module", module))
        critic = DataParallelPPOCritic(
            _critic_config(), module, optimizer, dp_group=layout.dp_group, sp=layout.sp if name == "sp2" else None
        )
        values = critic.compute_values(data)
        data.batch["values"] = values + 0.1  # the same old values for both (set by sp1 first)
        metrics = critic.update_critic(data)
        out[name] = {"values": values, "grads": optimizer.grads, "vf_loss": metrics["critic/vf_loss"]}
        data.batch.pop("values")
        del critic, module
    return out


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        layout = build_layout(SP, "test.ulysses_sequence_parallel_size")
        results = {
            "layout": (layout.dp_rank, layout.dp_size, layout.sp_rank, layout.sp_size, layout.is_collect),
            "exchanges": _exchanges(layout.sp, rank),
            "actor": _actor_runs(layout),
            "critic": _critic_runs(layout),
        }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # see test_dp_actor_distributed.py: DDP models go before the group
        gc.collect()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ulysses")
    torch.set_num_threads(1)
    mp.spawn(_rank_main, args=(SP, find_free_port(), str(out)), nprocs=SP, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(SP)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b| (the scale of the reference)."""
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def test_layout_puts_consecutive_ranks_in_one_sp_group(ranks):
    assert [r["layout"] for r in ranks] == [(0, 1, 0, 2, True), (0, 1, 1, 2, False)]
    # 4 ranks, sp 2: rank = dp_rank * 2 + sp_rank
    assert [layout_of(r, 4, 2, "k") for r in range(4)] == [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]
    with pytest.raises(ValueError, match="critic.ulysses_sequence_parallel_size=3 must .* divide"):
        layout_of(0, 4, 3, "critic.ulysses_sequence_parallel_size")


def test_all_to_all_sends_heads_and_gathers_positions(ranks):
    for r, result in enumerate(ranks):
        # rank r keeps heads 2r, 2r+1 of all 6 positions; position t came from rank t // 3, local t % 3
        expected = torch.tensor([[100 * (t // 3) + 10 * (2 * r + j) + t % 3 for t in range(6)] for j in range(2)])
        assert torch.equal(result["exchanges"]["a2a"].reshape(2, 6), expected.float())


def test_all_to_all_backward_is_the_reverse_exchange(ranks):
    for r, result in enumerate(ranks):
        # x[h, s] of rank r went to rank h // 2 as head h % 2 at position 3r + s, weighted there by
        # 1000 * (h // 2) + 10 * (h % 2) + 3r + s
        expected = torch.tensor([[1000 * (h // 2) + 10 * (h % 2) + 3 * r + s for s in range(3)] for h in range(4)])
        assert torch.equal(result["exchanges"]["a2a_grad"].reshape(4, 3), expected.float())


def test_gather_concatenates_in_rank_order_and_scales_the_gradient_by_sp(ranks):
    for r, result in enumerate(ranks):
        assert torch.equal(result["exchanges"]["gather"], torch.tensor([0.0, 1, 2, 10, 11, 12]))
        assert torch.equal(result["exchanges"]["gather_grad"], 2 * torch.arange(3 * r, 3 * r + 3).float())


@pytest.mark.parametrize("variant", sorted(ACTOR_VARIANTS))
def test_actor_sp2_equals_sp1(ranks, variant):
    for result in ranks:  # every SP rank holds the whole micro-batch's outputs
        sp1, sp2 = result["actor"][f"{variant}/sp1"], result["actor"][f"{variant}/sp2"]
        assert _rel(sp2["log_probs"], sp1["log_probs"]) <= 1e-5
        assert _rel(sp2["entropy"], sp1["entropy"]) <= 1e-5
        for key in ("pg_loss", "kl_loss"):
            assert _rel(torch.tensor(sp2[key]), torch.tensor(sp1[key])) <= 1e-5
        assert sp2["grads"].keys() == sp1["grads"].keys()
        for name, g1 in sp1["grads"].items():
            assert _rel(sp2["grads"][name], g1) <= 1e-4, name
    # a wrong gradient scale (no x sp in the gather's backward) would be off by 2: the check is not loose
    assert min(float(g.abs().max()) for g in ranks[0]["actor"][f"{variant}/sp1"]["grads"].values()) > 1e-6


def test_key_value_heads_are_repeated_when_they_do_not_divide(ranks):
    plain, sharded = ranks[0]["actor"]["one_kv_head"]
    assert _rel(sharded, plain) <= 1e-5


def test_critic_sp2_equals_sp1(ranks):
    for result in ranks:
        sp1, sp2 = result["critic"]["sp1"], result["critic"]["sp2"]
        assert _rel(sp2["values"], sp1["values"]) <= 1e-5
        assert _rel(torch.tensor(sp2["vf_loss"]), torch.tensor(sp1["vf_loss"])) <= 1e-5
        assert sp2["grads"].keys() == sp1["grads"].keys()
        for name, g1 in sp1["grads"].items():
            assert _rel(sp2["grads"][name], g1) <= 1e-4, name


def test_packed_causal_mask_keeps_each_sequence_to_itself():
    # two sequences (positions 0 1 2, then 0 1) and a row padded by a dummy sequence starting at 5 -> 0
    mask = packed_causal_mask(torch.tensor([[0, 1, 2, 0, 1], [3, 4, 5, 0, 1]]))[:, 0]
    seq = torch.tensor([0, 0, 0, 1, 1])
    expected = (seq[:, None] == seq[None, :]) & (torch.arange(5)[None, :] <= torch.arange(5)[:, None])
    assert torch.equal(mask[0], expected)
    assert torch.equal(mask[1], expected)  # a row may start mid-count: its first token starts a sequence


def test_heads_that_do_not_divide_name_the_key():
    model = tiny_causal_lm()  # 4 attention heads
    with pytest.raises(ValueError, match=r"critic.ulysses_sequence_parallel_size=3 must divide .* heads \(4\)"):
        use_ulysses_attention(model, 3, "critic.ulysses_sequence_parallel_size")
