"""Where the trainer meets a generative reward model: which runs need a judge, what its workers get,
and the judge the reward managers call once the workers are up.

A run has a judge when ``reward.reward_model.enable`` is true and its reward manager declares
``needs_judge`` (``genrm``, or a user's manager built on it). The judge's workers are a role of the
trainer's pool (colocated with the actor, one engine per rank, as veRL's colocated reward loop), and
the reward model worker for sequence-classification models is not started.
"""

from __future__ import annotations

from hybridflow.rewards.registry import manager_needs_judge
from hybridflow.workers.judge_client import RolloutJudge
from hybridflow.workers.judge_worker import MODEL_PATH_KEY
from hybridflow.workers.model_loading import load_tokenizer, local_model_path

JUDGE_ROLE = "judge"


def uses_judge(config) -> bool:
    reward = config.reward
    return bool(reward.reward_model.enable) and manager_needs_judge(reward.reward_manager)


def judge_worker_config(config) -> dict:
    """JudgeWorker's keyword arguments: the judge's model, its typed ``reward.reward_model.rollout``."""
    rm = config.reward.reward_model
    trust = config.reward_model.model.trust_remote_code  # the earlier section's key, honoured as before
    return {"model_path": rm.model_path, "rollout": rm.rollout, "trust_remote_code": bool(trust)}


def start_judge(judge_wg, config, reward_fns) -> RolloutJudge:
    """Start the judge engines, build the client over them and hand it to every reward manager that
    takes one; returns the client (the trainer closes it)."""
    judge_wg.init_model()
    path = local_model_path(config.reward.reward_model.model_path, MODEL_PATH_KEY)
    tokenizer = load_tokenizer(path, bool(config.reward_model.model.trust_remote_code))
    judge = RolloutJudge.from_group(judge_wg, JUDGE_ROLE, tokenizer, config.reward.reward_model.rollout)
    for fn in reward_fns:
        if hasattr(fn, "attach_judge"):
            fn.attach_judge(judge)
    return judge
