"""configs/ppo_trainer.yaml, generation.yaml, evaluation.yaml and sft_trainer.yaml, generated from their
declarations (``hybridflow.config.ppo_trainer``, ``.generation``, ``.evaluation``, ``.sft_trainer``).

    python -m devtools.config_yaml            # rewrite the files
    python -m devtools.config_yaml --check    # exit 1 when the file is stale

Every key is written with its default, or the interpolation it follows, and a comment from its one-line
doc; top-level sections are separated by a blank line. Change a key in hybridflow/config/ and run this
(then ``config_tree`` and ``config_table``, which read the yaml); tests/devtools/test_config_yaml.py
fails when a file and its declaration differ.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hybridflow.config.evaluation import EvaluationConfig
from hybridflow.config.generation import GenerationConfig
from hybridflow.config.ppo_trainer import PPOTrainerConfig
from hybridflow.config.sft_trainer import SFTTrainerConfig
from hybridflow.config.tree import entries

__all__ = ["CONFIGS", "render", "main"]

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 120

PPO_HEADER = """\
hybridflow PPO / GRPO trainer configuration: veRL 0.9.1's ppo_trainer tree, key for key.
Generated from hybridflow/config/ by `python -m devtools.config_yaml`; do not edit.

A veRL command line
  python3 -m verl.trainer.main_ppo data.train_batch_size=256 actor_rollout_ref.actor.optim.lr=1e-6 ...
runs unchanged as `python -m hybridflow.main_ppo ...`. Values are veRL 0.9.1's defaults unless a
comment says "hybridflow:". Every key has a status (declared with the key; the table is
docs/config_keys.md): honoured, or refused by name when set to a value hybridflow does not implement,
or accepted with a printed note. An unknown key fails with the closest valid key named; add a key on
purpose with `+key=value`.

veRL's ${oc.select:key,default} interpolations are written ${key} where the key is in this tree
(the same values; Hydra resolves the plain form much faster).

Keys that veRL moved are accepted under both spellings and mapped once, at load time, onto the
canonical place (the conflict of two different values is an error): the "legacy" sections at the end.

Batch-size vocabulary (all "global" sizes count prompts, before the n-fold repeat of rollout.n):
  data.train_batch_size          prompts drawn per training step
  *.ppo_mini_batch_size          prompts per optimizer step (x rollout.n samples, split over ranks)
  *_micro_batch_size_per_gpu     samples per forward/backward on one rank (gradient accumulation)
  *_micro_batch_size             deprecated global form of the above; set only one of the two
"""

EVALUATION_HEADER = """\
hybridflow offline evaluation: score generated responses with the reward scorers and report the
mean score per data source (`python -m hybridflow.main_eval key=val ...`). veRL 0.9.1's keys;
"hybridflow:" marks additions. Key statuses: docs/config_keys.md.
Generated from hybridflow/config/evaluation.py by `python -m devtools.config_yaml`; do not edit.
"""

GENERATION_HEADER = """\
hybridflow offline generation: sample n responses for every prompt of a parquet file
(`python -m hybridflow.main_generation key=val ...`). veRL 0.9.1 has no generation config; the keys
and defaults are those of veRL main's generation.yaml (January 2026, the newest veRL that has one).
"hybridflow:" marks additions and changed defaults. Key statuses: docs/config_keys.md.
Generated from hybridflow/config/generation.py by `python -m devtools.config_yaml`; do not edit.
"""

SFT_HEADER = """\
hybridflow supervised fine-tuning (`python -m hybridflow.main_sft key=val ...`, or under torchrun).
Generated from hybridflow/config/sft_trainer.py by `python -m devtools.config_yaml`; do not edit.

The tree is veRL 0.9.1's sft_trainer_engine.yaml (the config of verl.trainer.sft_trainer, 0.9.1's SFT
entry point), key for key, with veRL's defaults unless a comment says "hybridflow:". The keys of
veRL's earlier fsdp_sft_trainer (model.partial_pretrain, optim.lr_scheduler, data.multiturn.*, ...;
veRL main's sft_trainer.yaml) are accepted too (null: not set) and mapped onto the 0.9.1 keys at load
time. hybridflow's SFT trainer reads single-turn rows (data.prompt_key / data.response_key) and
conversations (data.messages_key + data.tools_key; loss on the assistant turns) when
data.multiturn.enable=True or the data has a messages column and no prompt column. Key statuses:
docs/config_keys.md.
"""

# file under configs/ -> (the declaration's default instance, the header comment)
CONFIGS: dict[str, tuple[Callable[[], Any], str]] = {
    "ppo_trainer.yaml": (PPOTrainerConfig, PPO_HEADER),
    "evaluation.yaml": (EvaluationConfig, EVALUATION_HEADER),
    "generation.yaml": (GenerationConfig, GENERATION_HEADER),
    "sft_trainer.yaml": (SFTTrainerConfig, SFT_HEADER),
}


def _scalar(value: Any) -> str:
    """``value`` as a yaml scalar or flow sequence/mapping that reads back as the same value."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False).strip()
    text = text.removesuffix("\n...").strip()
    if yaml.safe_load(text) != value:
        raise ValueError(f"cannot write {value!r} as one yaml line")
    return text


def _comment(lines: list[str], indent: str, text: str) -> None:
    for line in textwrap.wrap(text, WIDTH - len(indent) - 2):
        lines.append(f"{indent}# {line}")


def _line(lines: list[str], indent: str, body: str, text: str) -> None:
    """``body`` with its doc: inline when the line fits, else on the line above."""
    if text and len(indent) + len(body) + 4 + len(text) <= WIDTH:
        lines.append(f"{indent}{body}  # {text}")
    else:
        if text:
            _comment(lines, indent, text)
        lines.append(f"{indent}{body}")


def render(obj: Any, header: str = "") -> str:
    """The yaml text of a declaration instance."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    for e in entries(obj):
        indent = "  " * e.depth
        key = e.path.rsplit(".", 1)[-1]
        text = "" if key == "_target_" else e.doc
        if e.depth == 0:
            lines.append("")
            if text:
                _comment(lines, "", text)
            text = ""
        body = f"{key}:" if e.nested else f"{key}: {_scalar(e.value)}"
        _line(lines, indent, body, text)
    return "\n".join(lines).lstrip("\n") + "\n"


def _target(name: str) -> Path:
    return ROOT / "configs" / name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, (factory, header) in CONFIGS.items():
        text = render(factory(), header)
        path = _target(name)
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python -m devtools.config_yaml", file=sys.stderr)
        return 1
    print("\n".join(f"wrote configs/{n}" for n in stale) if stale and not args.check else "up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
