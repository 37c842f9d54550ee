"""A bare single-process GRPO loop (plain torch + transformers) next to a hybridflow GRPO step on the
same model, batch and settings.

    python benchmarks/bare_grpo_step.py [--quick] [--steps N] [--backends inprocess,ray1]

Workload (DESIGN.md's calibration): tiny Qwen2, tiny arithmetic task in GSM8K format, 16 prompts × 8
samples, ≤32 new tokens, temperature 1.0, gsm8k rule scorer, group-normalised advantages, one
policy-gradient update (AdamW, lr 1e-4, grad clip 1.0, no KL, no entropy bonus).

The bare loop is the baseline: generate → decode + score → advantages → one forward/backward/step.
hybridflow runs ``RayPPOTrainer.train_step`` with the same settings; on top of the bare loop it
recomputes the old log-probs (one extra no-grad forward: the PPO ratio needs π_old; with one update
per batch it equals the detached current log-prob), pushes the trained weights into the rollout
copy of the model, and moves data between driver and workers. Steps are interleaved (bare,
inprocess, ray, bare, ...) so the machine's load hits all alike. Goal: hybridflow <= 1.5× bare.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

GOAL = 1.5


class BareGRPO:
    """The whole GRPO step in one function's worth of plain torch (``step``)."""

    def __init__(self, model_dir: str, setup: C.GRPOSetup, loader):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.setup = setup
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=setup.lr, betas=(0.9, 0.999), weight_decay=0.01)
        self.batches = iter(loader)
        self.eos, self.pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id

    def step(self) -> dict[str, float]:
        from hybridflow.rewards.scorers.gsm8k import compute_score

        torch, s = self.torch, self.setup
        t0 = time.perf_counter()
        batch = next(self.batches)
        ids = batch["input_ids"].repeat_interleave(s.n, dim=0)  # (B*n, P), left-padded
        mask = batch["attention_mask"].repeat_interleave(s.n, dim=0)
        truths = [rm["ground_truth"] for rm in batch["reward_model"] for _ in range(s.n)]

        # generate
        self.model.eval()
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=s.response_length,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                eos_token_id=self.eos,
                pad_token_id=self.pad,
            )
        resp = out[:, ids.size(1) :]  # (B*n, r)
        is_eos = (resp == self.eos).int()
        resp_mask = ((is_eos.cumsum(-1) - is_eos) == 0).float()  # up to and including the first EOS
        t1 = time.perf_counter()

        # score and group-normalised advantages
        texts = self.tokenizer.batch_decode(resp, skip_special_tokens=True)
        scores = torch.tensor([compute_score(t, g) for t, g in zip(texts, truths)])
        groups = scores.view(-1, s.n)  # (B, n)
        adv = ((groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, keepdim=True) + 1e-6)).view(-1)
        t2 = time.perf_counter()

        # one policy-gradient update (ratio 1: PPO's clipped loss reduces to -A·log π)
        self.model.train()
        full_mask = torch.cat([mask, resp_mask.long()], dim=1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=out, attention_mask=full_mask, position_ids=positions).logits
        logits = logits[:, ids.size(1) - 1 : -1].float()  # predicts the response tokens
        logp = torch.log_softmax(logits, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        loss = -(adv.unsqueeze(-1) * logp * resp_mask).sum() / resp_mask.sum().clamp(min=1)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        t3 = time.perf_counter()
        return {"gen": t1 - t0, "reward+adv": t2 - t1, "update": t3 - t2, "step": t3 - t0}


def hybridflow_stepper(backend: str, setup: C.GRPOSetup, steps: int, data_dir: str, model_dir: str, out_dir: str):
    from hybridflow.protocol import DataProto

    trainer, loader = C.build_trainer(C.grpo_overrides(data_dir, model_dir, out_dir, setup, backend, 1, steps))
    batches = iter(loader)

    def step() -> dict[str, float]:
        trainer.global_steps += 1
        m = trainer.train_step(DataProto.from_single_dict(next(batches)))
        return {
            "gen": m["timing_s/gen"],
            "reward+adv": m["timing_s/reward"] + m["timing_s/adv"],
            "old_log_prob": m["timing_s/old_log_prob"],
            "update": m["timing_s/update_actor"],
            "step": m["timing_s/step"],
        }

    return trainer, step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny settings for a smoke run")
    p.add_argument("--steps", type=int, default=None, help="measured steps per row (default 6; quick 1)")
    p.add_argument("--backends", default="inprocess,ray1", help="comma list of inprocess, ray1")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads of this process (bare loop and in-process worker); Ray workers run with 1",
    )
    args = p.parse_args(argv)
    C.set_threads(args.torch_threads)
    setup = C.GRPOSetup(prompts=4, n=2, response_length=8, train_size=32) if args.quick else C.GRPOSetup()
    steps = args.steps or (1 if args.quick else 6)
    warmup = 1
    names = args.backends.split(",")
    from hybridflow.config.loader import load_config
    from hybridflow.data.rl_dataset import RLHFDataset, collate_fn
    from hybridflow.data.sampler import create_rl_dataloader
    from hybridflow.workers.model_loading import load_tokenizer

    trainers = []
    with tempfile.TemporaryDirectory(prefix="hf_bench_") as root:
        data_dir, model_dir = C.make_assets(root, setup)
        try:
            data_cfg = load_config("ppo_trainer", [f"data.max_prompt_length={setup.prompt_length}"]).data
            dataset = RLHFDataset(os.path.join(data_dir, "train.parquet"), load_tokenizer(model_dir, False), data_cfg)
            # the same seed and batch size as the trainer's loader: the same prompts in the same order
            loader = create_rl_dataloader(
                dataset, batch_size=setup.prompts, seed=0, shuffle=True, collate_fn=collate_fn
            )
            rows = {"bare": BareGRPO(model_dir, setup, loader).step}
            labels = {
                "bare": "bare loop (1 process)",
                "inprocess": "hybridflow inprocess",
                "ray1": "hybridflow ray (1 worker)",
            }
            for name in names:
                backend = "inprocess" if name == "inprocess" else "ray"
                trainer, step = hybridflow_stepper(backend, setup, steps + warmup, data_dir, model_dir, root)
                trainers.append(trainer)
                rows[name] = step
            times = {k: [] for k in rows}
            for i in range(steps + warmup):
                for name, step in rows.items():
                    result = step()
                    if i >= warmup:
                        times[name].append(result)
        finally:
            for trainer in trainers:
                C.shutdown_trainer(trainer)

    phases = ["gen", "reward+adv", "old_log_prob", "update", "step"]
    bare_step = C.median([t["step"] for t in times["bare"]])
    table = []
    for name, results in times.items():
        med = {
            ph: C.median([r[ph] for r in results if ph in r]) if any(ph in r for r in results) else "-" for ph in phases
        }
        table.append([labels[name]] + [med[ph] for ph in phases] + [med["step"] / bare_step])
    print(
        f"\nGRPO step, {setup.prompts} prompts x {setup.n} samples, <= {setup.response_length} tokens, lr {setup.lr}; "
        f"median of {steps} interleaved steps; {C.machine_line()}"
    )
    C.print_table("Seconds per step (phases as each side times them)", ["row"] + phases + ["x bare"], table)
    for row in table[1:]:
        print(
            f"  {row[0]}: {row[-1]:.2f}x the bare loop -> {'meets' if row[-1] <= GOAL else 'MISSES'} the goal "
            f"(<= {GOAL}x)"
        )


if __name__ == "__main__":
    main()
