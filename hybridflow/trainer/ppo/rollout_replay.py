"""Dump every step's rollouts, and replay dumped steps instead of generating (debug training without a
rollout engine's cost or randomness).

Keys (veRL 0.9.1's places in the tree):

    trainer.rollout_data_dir      after every training step write ``<dir>/<step>.jsonl`` (rollout_dump.py)
    trainer.validation_data_dir   after every validation write ``<dir>/<step>.jsonl``
    skip.rollout.enable           replace the generate phase of the steps in ``skip.rollout.steps``
    skip.rollout.dump_dir         ... by the dump ``<dump_dir>/<step>.jsonl``
    skip.rollout.steps            the steps to replay (veRL: an empty list replays none; refused here)
    skip.rollout.action           cache: replay the step's own dump; when it is missing, generate and
                                  write it, so the next run replays it. repeat: replay the step's dump,
                                  else the nearest earlier one, else the nearest later one.

A dump written with ``trainer.rollout_data_dir`` is a valid ``skip.rollout.dump_dir``: point one run's
skip dir at another run's rollout dir. A replayed step takes prompts, ground truths, uids and response
tokens from the file (the dataloader still advances, so the following steps see the prompts they
would have); rewards, log-probs, advantages and the update are recomputed as usual. Validation always
generates. The choice between generating and replaying is made once, when the trainer is built.
"""

from __future__ import annotations

import logging
import os
import time

from hybridflow.config.skip import RolloutSkipConfig
from hybridflow.config.trainer import TrainerConfig
from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo import rollout_dump

__all__ = ["RolloutRecorder", "find_replay_file"]

logger = logging.getLogger(__name__)


def find_replay_file(dump_dir: str, step: int, action: str) -> str | None:
    """The dump a step replays: its own (cache); its own, else the nearest earlier, else the nearest
    later one (repeat); None when there is none."""
    own = rollout_dump.step_file(dump_dir, step)
    if os.path.isfile(own):
        return own
    if action != "repeat":
        return None
    available = rollout_dump.dumped_steps(dump_dir)
    earlier = [s for s in available if s < step]
    later = [s for s in available if s > step]
    pick = earlier[-1] if earlier else (later[0] if later else None)
    return None if pick is None else rollout_dump.step_file(dump_dir, pick)


class RolloutRecorder:
    """The trainer's dump/replay hooks: ``replay`` (in the generate phase), ``after_step`` (end of every
    training step) and ``after_validation``."""

    def __init__(
        self,
        tokenizer,
        trainer: TrainerConfig | None = None,
        skip: RolloutSkipConfig | None = None,
        samples_per_prompt: int = 1,
    ):
        """``trainer``: the typed trainer section (``rollout_data_dir``, ``validation_data_dir``); ``skip``: the
        typed ``skip.rollout`` (absent: nothing replayed); ``samples_per_prompt``: ``actor_rollout_ref.rollout.n``."""
        trainer = trainer or TrainerConfig()
        self.tokenizer = tokenizer
        self.rollout_data_dir = os.path.expanduser(trainer.rollout_data_dir) if trainer.rollout_data_dir else None
        self.validation_data_dir = (
            os.path.expanduser(trainer.validation_data_dir) if trainer.validation_data_dir else None
        )
        self.skip = skip or RolloutSkipConfig()
        self.skip_dir = os.path.expanduser(self.skip.dump_dir)
        self.samples_per_prompt = int(samples_per_prompt)
        self._generated_for_cache: set[int] = set()  # listed steps generated for lack of a dump: write them
        self.replayed: dict[int, str] = {}  # step -> the file it replayed

    # ------------------------------------------------------------------------------ replay
    def replay(self, batch: DataProto, step: int, timing: dict) -> DataProto | None:
        """This step's dumped batch when trainer.skip lists the step and a dump exists; None: generate
        (a listed step without a dump is generated and, with action=cache, written afterwards)."""
        if not self.skip.enable or step not in self.skip.steps:
            return None
        path = find_replay_file(self.skip_dir, step, self.skip.action)
        if path is None:
            logger.info("[skip.rollout] step %s: no dump in %s; generating and writing it", step, self.skip_dir)
            self._generated_for_cache.add(step)
            return None
        start = time.perf_counter()
        replayed = self.load(path, expected_rows=len(batch) * self.samples_per_prompt, dataloader_batch=batch)
        timing["gen"] = timing.get("gen", 0.0) + time.perf_counter() - start
        self.replayed[step] = path
        logger.info("[skip.rollout] step %s: replayed %d samples from %s (no generation)", step, len(replayed), path)
        return replayed

    def load(self, path: str, expected_rows: int, dataloader_batch: DataProto | None = None) -> DataProto:
        rows = rollout_dump.read_rows(path)
        if len(rows) != expected_rows:
            raise ValueError(
                f"{path} holds {len(rows)} samples but a step here takes {expected_rows} "
                "(data.train_batch_size × actor_rollout_ref.rollout.n): it was dumped with other sizes"
            )
        batch = rollout_dump.rows_to_batch(rows, rollout_dump.pad_token_id_of(self.tokenizer), source=path)
        if "response_mask" not in batch.batch.keys():  # a dump of a batch that had none: the rollout layout's
            batch.batch["response_mask"] = batch.batch["attention_mask"][:, -batch.batch["responses"].shape[-1] :]
        if (
            dataloader_batch is not None
            and "index" in dataloader_batch.non_tensor_batch
            and "index" in batch.non_tensor_batch
        ):
            ours = sorted(map(str, dataloader_batch.non_tensor_batch["index"]))
            theirs = sorted(set(map(str, batch.non_tensor_batch["index"])))
            if ours != theirs and self.skip.action == "cache":
                logger.warning(
                    "[skip.rollout] note: %s holds other prompts than this step's dataloader batch "
                    "(another seed or data set); training on the dumped ones",
                    path,
                )
        return batch

    # ------------------------------------------------------------------------------ dumps
    def after_step(self, batch: DataProto, step: int) -> dict[str, float]:
        """Write the finished step (trainer.rollout_data_dir, and the skip dir for a cache miss)."""
        targets = [d for d in (self.rollout_data_dir,) if d]
        if step in self._generated_for_cache:
            targets.append(self.skip_dir)
            self._generated_for_cache.discard(step)
        if not targets:
            return {}
        start = time.perf_counter()
        rows = rollout_dump.batch_to_rows(batch, self.tokenizer, step)
        for directory in targets:
            rollout_dump.write_rows(rollout_dump.step_file(directory, step), rows)
        return {"timing_s/dump_rollout_generations": time.perf_counter() - start}

    def after_validation(self, batch: DataProto, scores, step: int) -> None:
        if self.validation_data_dir:
            rows = rollout_dump.batch_to_rows(batch, self.tokenizer, step, scores=scores)
            rollout_dump.write_rows(rollout_dump.step_file(self.validation_data_dir, step), rows)
