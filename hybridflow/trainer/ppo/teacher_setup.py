"""Where the trainer meets its distillation teachers (``distillation.*``, veRL 0.9.1's on-policy distillation).

Which teachers (veRL's resolution): a single ``teacher_models.teacher_model`` scores every sample; once
other teachers are added with ``+``, ``teacher_model`` is dropped and each sample goes to the teacher
whose ``key`` equals the sample's ``distillation.teacher_key`` column (``data_source`` by default).
Each teacher is a ``JudgeWorker`` group of its own pool (``num_replicas`` processes; a single teacher
with 0 takes ``n_gpus_per_node * nnodes``, at least 1), serving ``model_path`` on its ``inference``
engine (hf or vllm). After generation the teachers score the student's response tokens: the top-k
log-probs for ``forward_kl_topk``, else the sampled token's log-prob; the actor's loss reads them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hybridflow.algorithms.distillation import get_distillation_loss
from hybridflow.protocol import DataProto
from hybridflow.workers.model_loading import load_tokenizer, local_model_path

TEACHER_PREFIX = "teacher_"
_KEY = "distillation.teacher_models"


def resolve_teachers(distillation) -> dict[str, tuple[str, object]]:
    """routing key -> (the teacher's name under teacher_models, its section); raises on a teacher
    without model_path, a missing or repeated key, an unknown loss_mode or policy_loss_mode."""
    loss = distillation.distillation_loss
    if get_distillation_loss(loss.loss_mode).use_topk and not loss.topk:
        raise ValueError("distillation.distillation_loss.topk must be set for loss_mode=forward_kl_topk")
    if not loss.use_policy_gradient and loss.loss_mode == "k1":
        raise ValueError(
            "distillation.distillation_loss.loss_mode=k1 needs use_policy_gradient=True: the gradient of k1 "
            "does not depend on the teacher (veRL refuses it too)"
        )
    teachers = dict(distillation.teacher_models)
    if len(teachers) > 1:
        teachers.pop("teacher_model", None)
    routed: dict[str, tuple[str, object]] = {}
    for name, teacher in teachers.items():
        if not teacher.model_path:
            raise ValueError(f"{_KEY}.{name}.model_path must be set when distillation.enabled=True")
        key = "default" if len(teachers) == 1 else teacher.key
        if key is None or key in routed:
            raise ValueError(f"{_KEY}.{name}.key must be set and differ from the other teachers' (got {key!r})")
        routed[key] = (name, teacher)
    return routed


def teacher_replicas(distillation, teacher, single: bool) -> int:
    if teacher.num_replicas:
        return int(teacher.num_replicas)
    pool = int(distillation.n_gpus_per_node) * int(distillation.nnodes) if single else 0
    return max(pool, 1)


def teacher_engine(teacher, topk: int):
    """The teacher's ``inference`` section as its engine reads it: the student's prompt and response fit
    in its context (veRL's rule), and vllm returns at least ``topk`` log-probs per position."""
    inference = teacher.inference
    context = inference.prompt_length + inference.response_length + 1
    if inference.max_model_len is not None and inference.max_model_len < context:
        raise ValueError(
            f"distillation teacher inference.max_model_len={inference.max_model_len} leaves no room for the "
            f"student's prompt and response ({context} tokens)"
        )
    kwargs = dict(inference.engine_kwargs or {})
    if inference.name == "vllm" and topk:
        vllm = dict(kwargs.get("vllm") or {})
        vllm["max_logprobs"] = max(int(vllm.get("max_logprobs") or 0), topk)
        kwargs["vllm"] = vllm
    return dataclasses.replace(inference, max_model_len=inference.max_model_len or context, engine_kwargs=kwargs)


def teacher_pools(config) -> dict[str, tuple[int, dict]]:
    """role (= pool) name -> (processes, JudgeWorker keyword arguments), one per teacher."""
    d = config.distillation
    if not d.enabled:
        return {}
    teachers = resolve_teachers(d)
    topk = int(d.distillation_loss.topk or 0) if get_distillation_loss(d.distillation_loss.loss_mode).use_topk else 0
    trust = bool(config.actor_rollout_ref.model.trust_remote_code)
    return {
        TEACHER_PREFIX + name: (
            teacher_replicas(d, teacher, len(teachers) == 1),
            {
                "model_path": teacher.model_path,
                "rollout": teacher_engine(teacher, topk),
                "trust_remote_code": trust,
                "path_key": f"{_KEY}.{name}.model_path",
            },
        )
        for name, teacher in teachers.values()
    }


def check_same_tokenizer(student, teacher_name: str, teacher_path: str, trust: bool) -> None:
    """A teacher scores the student's token ids: its vocabulary must be the student's."""
    teacher = load_tokenizer(local_model_path(teacher_path, f"{_KEY}.{teacher_name}.model_path"), trust)
    if teacher.get_vocab() != student.get_vocab():
        raise ValueError(
            f"distillation teacher {teacher_name!r} ({teacher_path}) has another tokenizer than the student: "
            "it would score token ids that mean other text"
        )


def route_samples(values, keys: list[str]) -> dict[str, np.ndarray]:
    """routing key -> the row indices it scores: every row for a single teacher, else by ``values``."""
    if len(keys) == 1:
        return {keys[0]: np.arange(len(values))}
    values = np.asarray(values, dtype=object)
    unknown = sorted({str(v) for v in values if v not in keys})
    if unknown:
        raise ValueError(f"no distillation teacher has key {unknown[0]!r}; the teachers' keys: {sorted(keys)}")
    return {key: np.flatnonzero(values == key) for key in keys if (values == key).any()}


class Teachers:
    """The driver's side: ``score(batch)`` adds ``teacher_ids`` / ``teacher_log_probs`` (B, R, K) to it."""

    def __init__(self, config, groups: dict, tokenizer):
        d = config.distillation
        self.loss = d.distillation_loss
        self.teacher_key = d.teacher_key
        self.topk = int(self.loss.topk) if get_distillation_loss(self.loss.loss_mode).use_topk else 0
        trust = bool(config.actor_rollout_ref.model.trust_remote_code)
        self.groups = {}
        for key, (name, teacher) in resolve_teachers(d).items():
            check_same_tokenizer(tokenizer, name, teacher.model_path, trust)
            group = groups[TEACHER_PREFIX + name]
            group.init_model()
            self.groups[key] = (group, bool(teacher.inference.free_cache_engine))

    def score(self, batch: DataProto) -> None:
        rows = len(batch)
        column = batch.non_tensor_batch.get(self.teacher_key)
        if column is None and len(self.groups) > 1:
            raise ValueError(f"distillation.teacher_key={self.teacher_key!r} is not a column of the batch")
        parts = route_samples(column if column is not None else [None] * rows, list(self.groups))
        inputs = batch.select(batch_keys=["input_ids", "attention_mask", "responses"])
        inputs.meta_info = {"topk": self.topk}
        ids = log_probs = None
        for key, index in parts.items():
            group, sleeps = self.groups[key]
            if sleeps:
                group.wake_judge()
            try:
                out = group.score_tokens(inputs[torch.as_tensor(index)]).batch
            finally:
                if sleeps:
                    group.sleep_judge()
            if ids is None:
                ids = torch.zeros(rows, *out["teacher_ids"].shape[1:], dtype=torch.long)
                log_probs = torch.zeros(ids.shape)
            ids[index], log_probs[index] = out["teacher_ids"], out["teacher_log_probs"]
        batch.batch["teacher_ids"], batch.batch["teacher_log_probs"] = ids, log_probs
