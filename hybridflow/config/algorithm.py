"""The ``algorithm`` section (veRL's AlgoConfig): advantage estimator, discounting, KL in the reward,
group filtering and rollout correction. Names of estimators and KL penalties are checked against their
registries where they are used (users register their own), not here."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section, unset
from hybridflow.config.errors import ConfigError, check_at_least, check_one_of
from hybridflow.config.rollout_correction import RolloutCorrectionConfig
from hybridflow.config.rules import Problems

__all__ = ["KLControlConfig", "FilterGroupsConfig", "PFPPOConfig", "AlgoConfig", "algorithm_as_in_yaml"]

KL_CONTROLLERS = ("fixed", "adaptive")
_GDPO = "read by adv_estimator=gdpo"


@dataclass
class KLControlConfig(BaseConfig):
    """``algorithm.kl_ctrl``: the coefficient of the in-reward KL penalty, fixed or adaptive."""

    _target_: str = doc("verl.trainer.config.KLControlConfig", "the class this section is read into")
    type: str = doc("fixed", "fixed | adaptive (moves kl_coef towards target_kl)")
    kl_coef: float = doc(0.001, "the (initial) KL coefficient")
    horizon: int = doc(10000, "adaptive: steps over which the coefficient adapts")
    target_kl: float = doc(0.1, "adaptive: the KL the coefficient steers towards")

    def check_values(self) -> None:  # veRL's KLControlConfig checks nothing when built
        check_one_of("algorithm.kl_ctrl.type", self.type, KL_CONTROLLERS)

    def validate(self) -> list[str]:
        if self.type == "adaptive" and not self.horizon > 0:
            raise ConfigError("algorithm.kl_ctrl.type=adaptive needs algorithm.kl_ctrl.horizon > 0")
        return []


@dataclass
class FilterGroupsConfig(BaseConfig):
    """``algorithm.filter_groups``: DAPO's dynamic sampling (drop groups whose metric does not vary)."""

    _target_: str = doc("verl.trainer.config.FilterGroupsConfig", "the class this section is read into")
    enable: bool = doc(False, "drop prompt groups whose samples all score the same, and generate more")
    metric: str | None = doc(None, "what must vary in a group: reward (pre-KL score) or a reward_extra_info key")
    max_num_gen_batches: int = doc(0, "generation batches per step before giving up; <= 0: no limit")
    max_inflight_gen_batches: int = doc(1, "generation batches in flight at once, in train_batch_size units")

    def check_values(self) -> None:  # veRL's FilterGroupsConfig checks nothing when built
        p = "algorithm.filter_groups"
        if self.enable and (not isinstance(self.metric, str) or not self.metric):
            raise ConfigError(
                f"{p}.metric must name the value groups are compared on when {p}.enable=True "
                f"('reward' or a field of the reward's extra info such as 'acc'), got {self.metric!r}"
            )
        check_at_least(p, self, ("max_inflight_gen_batches",), 1)


@dataclass
class PFPPOConfig(BaseConfig):
    """``algorithm.pf_ppo``: PF-PPO's sample weights (from each sequence's score)."""

    reweight_method: str = doc("pow", "pow | max_min | max_random", values=("pow", "max_min", "max_random"))
    weight_pow: float = doc(2.0, "pow: the exponent of the weights")


@dataclass
class AlgoConfig(BaseConfig):
    """``algorithm``: how rewards become advantages."""

    _target_: str = doc("verl.trainer.config.AlgoConfig", "the class this section is read into")
    rollout_correction: RolloutCorrectionConfig | None = section(unset, "off-policy correction of the rollout")
    gamma: float = doc(1.0, "discount factor")
    lam: float = doc(1.0, "GAE lambda: bias/variance trade-off of the estimator")
    adv_estimator: str = doc("gae", "name in the advantage-estimator registry: gae, grpo, rloo, ...")
    norm_adv_by_std_in_grpo: bool = doc(True, "grpo: divide by the group's reward std")
    filter_groups: FilterGroupsConfig | None = section(unset, "DAPO's dynamic sampling")
    use_kl_in_reward: bool = doc(False, "subtract a KL penalty to the reference policy from the token rewards")
    kl_penalty: str = doc("kl", "KL estimator of the in-reward penalty: kl, abs, mse, low_var_kl, full")
    kl_ctrl: KLControlConfig = section(KLControlConfig, "the in-reward KL coefficient")
    use_pf_ppo: bool = doc(False, "PF-PPO (policy filtration): redraw the batch with replacement, weighted by reward")
    pf_ppo: PFPPOConfig | None = section(unset, "PF-PPO's sample weights")
    gdpo_reward_keys: list[str] | None = doc(None, "gdpo: reward dict keys normalised one by one", reason=_GDPO)
    gdpo_reward_weights: list[float] | None = doc(None, "gdpo: a weight per key (null: all 1)", reason=_GDPO)

    def validate(self) -> list[str]:
        """The keys one estimator reads, and the estimators the driver loop cannot feed yet (the rules that
        read the rollout or the actor too: ``hybridflow.config.rules``). Raises ConfigError; returns notes."""
        p, estimator = Problems(), self.adv_estimator
        if estimator == "remax":  # the estimator is there (algorithms/), the loop's greedy-baseline phase is not
            p.errors.append(
                "algorithm.adv_estimator=remax needs a greedy baseline response per prompt (veRL generates one "
                "each step); hybridflow's driver loop does not generate it yet: use grpo, rloo or reinforce_plus_plus"
            )
        keys, weights = self.gdpo_reward_keys, self.gdpo_reward_weights
        if estimator == "gdpo" and not keys:
            p.errors.append(
                "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components "
                "your reward function returns in its dict, e.g. "
                "+algorithm.gdpo_reward_keys=[format_reward,accuracy_reward]"
            )
        elif estimator == "gdpo" and weights is not None and len(weights) != len(keys):
            p.errors.append(
                f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(keys)} algorithm.gdpo_reward_keys"
            )
        p.run(self.kl_ctrl.validate)
        return p.raise_errors()


def algorithm_as_in_yaml() -> AlgoConfig:
    """``algorithm`` as veRL's ppo_trainer.yaml holds it: its nested sections configured, with the yaml's
    values where they differ from the dataclass defaults."""
    return AlgoConfig(
        rollout_correction=RolloutCorrectionConfig(rollout_is=None),
        filter_groups=FilterGroupsConfig(metric="reward"),
        pf_ppo=PFPPOConfig(),
    )
