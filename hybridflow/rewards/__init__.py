"""Rewards: the rule-based scorers, the sandbox that runs code, and the reward managers that apply
scorers to a batch.

    scorers/        pure scorers chosen by ``data_source`` (gsm8k, math, code); also importable
                    under veRL's path ``hybridflow.utils.reward_score``
    sandbox.py      runs untrusted Python in a separate, limited process (code scorer, code tool)
    sandbox_fusion.py  the same runs in a SandboxFusion service (``reward.sandbox_fusion.url``)
    registry.py     the reward managers by name (the built-ins listed there), load_reward_manager
    rule_manager.py the rule-based managers' shared part (RuleRewardManager)
    loop_manager.py veRL 0.9's reward-loop managers (RewardManagerBase, ``async run_single``), run as managers here
    bad_samples.py  a sample its scorer cannot score (raised, NaN/None, past its deadline): fail or score it
    manager.py      reward managers: a batch in, token-level scores out
    dapo.py         DAPO's reward manager (overlong buffer penalty)
    genrm.py        the generative reward model: an LLM judge's verdict as the score
                    (judge_template.py: its prompt; verdict_parsers.py: reading its verdict)
    custom.py       ``custom_reward_function.path`` / ``.name``
    streaming.py    the reward loop: ``reward.num_workers`` processes score each trajectory as it finishes
    pool_host.py    the fresh process those are forked from (never the trainer's own process)

The names below are resolved on first use, so that importing a scorer (text in, a number out) does
not import torch through the reward managers.
"""

import importlib

_EXPORTS = {
    "get_custom_reward_fn": "hybridflow.rewards.custom",
    "GenRMRewardManager": "hybridflow.rewards.genrm",
    "JudgeTemplate": "hybridflow.rewards.judge_template",
    "VERDICT_PARSERS": "hybridflow.rewards.verdict_parsers",
    "register_verdict_parser": "hybridflow.rewards.verdict_parsers",
    "REWARD_MANAGER_REGISTRY": "hybridflow.rewards.registry",
    "REWARD_MANAGERS": "hybridflow.rewards.registry",
    "BatchRewardManager": "hybridflow.rewards.manager",
    "NaiveRewardManager": "hybridflow.rewards.manager",
    "RewardComputationError": "hybridflow.rewards.rule_manager",
    "RuleRewardManager": "hybridflow.rewards.rule_manager",
    "RewardManagerBase": "hybridflow.rewards.loop_manager",
    "get_reward_manager_cls": "hybridflow.rewards.registry",
    "load_reward_manager": "hybridflow.rewards.registry",
    "register_reward_manager": "hybridflow.rewards.registry",
    "reward_metrics": "hybridflow.rewards.manager",
    "default_compute_score": "hybridflow.rewards.scorers",
    "register_scorer": "hybridflow.rewards.scorers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
