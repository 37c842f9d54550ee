"""``algorithm.rollout_correction`` (veRL's RolloutCorrectionConfig): importance weights and rejection
between the rollout engine's policy and the trained one. The threshold grammar (documented at the fields)
is parsed here, once, so that a bad value fails at start-up naming its key and the algorithms
(``hybridflow.algorithms.rollout_correction``) receive numbers."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from hybridflow.config.base import BaseConfig, doc
from hybridflow.config.errors import ConfigError, check_one_of

__all__ = [
    "IS_LEVELS",
    "RS_OPTIONS",
    "RS_ALIASES",
    "LOSS_TYPES",
    "RejectionOption",
    "parse_is_threshold",
    "normalise_rs_options",
    "parse_rejection_options",
    "RolloutCorrectionConfig",
]

IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
# <aggregation>_<estimator>: token-level, or a sequence's sum / mean / max of the token statistic
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
# veRL <= 0.6 named the ratio-bound rejections by level: the per-token ratio, the sequence's product of
# ratios (exp of the summed log ratio) and its geometric mean (exp of the mean log ratio)
RS_ALIASES = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
Bound = str | float | None  # a rejection threshold as the presets take it
_GEO = "0.999_1.001"  # the presets' geometric-mean band
_P = "algorithm.rollout_correction"


def _positive(value: float, what: str) -> float:
    if not value > 0:
        raise ConfigError(f"{what} must be positive, got {value}")
    return value


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{what}: {text!r} is not a number") from None


def _band(spec: str, what: str) -> tuple[float, float]:
    """(lower, upper) of a ``"lower_upper"`` band: both positive, lower <= upper."""
    low_text, high_text = spec.strip().split("_", 1)
    lower, upper = _positive(_number(low_text, what), f"{what} lower bound"), _number(high_text, what)
    if lower > upper:
        raise ConfigError(f"{what}={spec!r}: the lower bound exceeds the upper bound")
    return lower, _positive(upper, f"{what} upper bound")


def parse_is_threshold(spec: Any, key: str = "rollout_is_threshold") -> tuple[float, float | None]:
    """(upper, lower) of an IS threshold: a number is TIS's truncation bound (lower None), a band IcePop's."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ConfigError(f"{key} must be a number or a 'lower_upper' string, got {spec!r}")
    if isinstance(spec, str) and "_" in spec:
        lower, upper = _band(spec, key)
        return upper, lower
    upper = _number(spec, key) if isinstance(spec, str) else float(spec)
    return _positive(upper, f"{key} upper bound"), None


@dataclass(frozen=True)
class RejectionOption:
    """One rejection criterion. ``estimator`` k1 = -log r, k2 = (log r)²/2, k3 = r - 1 - log r with
    r = π_train/π_rollout per token; ``aggregation`` token or the sequence's sum / mean / max.
    k1 bounds are stored in log space (the statistic is a log ratio); as the statistic is -log r, a
    k1 'lower_upper' pair bounds the inverse ratio π_rollout/π_train (veRL's convention; the usual
    symmetric [1/u, u] reads the same either way). k2/k3 have only ``upper``."""

    name: str
    aggregation: str  # token | sum | mean | max
    estimator: str  # k1 | k2 | k3
    upper: float
    lower: float | None = None

    @property
    def level(self) -> str:
        return "token" if self.aggregation == "token" else "sequence"


def normalise_rs_options(rollout_rs: Any, key: str = "rollout_rs") -> str:
    """``rollout_rs`` as canonical, comma-joined option names: whitespace and duplicates dropped, legacy
    names mapped (``RS_ALIASES``), a list joined; an unknown name is an error naming the known ones."""
    if isinstance(rollout_rs, (list, tuple)) and all(isinstance(o, str) for o in rollout_rs):
        rollout_rs = ",".join(rollout_rs)
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise ConfigError(f"{key} must be a comma separated string of {', '.join(RS_OPTIONS)}, got {rollout_rs!r}")
    names = [RS_ALIASES.get(o.strip(), o.strip()) for o in rollout_rs.split(",") if o.strip()]
    for name in names:
        if name not in RS_OPTIONS:
            raise ConfigError(f"{key}: unknown option {name!r}; known: {', '.join(RS_OPTIONS)}")
    return ",".join(dict.fromkeys(names))


def parse_rejection_options(
    rollout_rs: str, threshold_spec: Any, key: str = "rollout_rs"
) -> tuple[RejectionOption, ...]:
    """``rollout_rs`` ("token_k1,seq_mean_k3") with ``rollout_rs_threshold``: one value shared by all
    options, or one per option (comma separated). k1 options take ratio bounds ``"lower_upper"`` (a
    single number u means [1/u, u]); k2/k3 a single positive upper bound."""
    names = normalise_rs_options(rollout_rs, key).split(",")
    tkey = f"{key}_threshold"
    if threshold_spec is None:
        raise ConfigError(f"{key}={rollout_rs!r} needs {tkey} (rejection has no default bound)")
    if isinstance(threshold_spec, bool) or not isinstance(threshold_spec, (int, float, str)):
        raise ConfigError(f"{tkey} must be a number or a string, got {threshold_spec!r}")
    specs = (
        [str(threshold_spec)]
        if not isinstance(threshold_spec, str)
        else [s.strip() for s in threshold_spec.split(",") if s.strip()]
    )
    if len(specs) not in (1, len(names)):
        raise ConfigError(
            f"{tkey}={threshold_spec!r}: give one threshold for all {len(names)} options of {key} "
            f"or exactly one per option"
        )
    specs = specs * len(names) if len(specs) == 1 else specs
    options = []
    for name, spec in zip(names, specs):
        aggregation = "token" if name.startswith("token") else name.split("_")[1]
        estimator = name.rsplit("_", 1)[1]
        what = f"{tkey} for {name}"
        if estimator == "k1":
            if "_" in spec:
                lower, upper = _band(spec, what)
            else:  # a single u means [1/u, u]
                upper = _positive(_number(spec, what), f"{what} upper bound")
                lower = 1.0 / upper
            options.append(RejectionOption(name, aggregation, estimator, math.log(upper), math.log(lower)))
        else:
            if "_" in spec:
                raise ConfigError(f"{what} takes a single upper bound, not a 'lower_upper' pair: {spec!r}")
            options.append(RejectionOption(name, aggregation, estimator, _positive(_number(spec, what), what)))
    return tuple(options)


@dataclass
class RolloutCorrectionConfig(BaseConfig):
    """``algorithm.rollout_correction``: off-policy correction between π_rollout and π_train (decoupled
    PPO weights, rejection masks, or bypass mode), with veRL's preset factories."""

    rollout_is: str | None = doc("sequence", "IS weight level: null (metrics only), token or sequence")
    rollout_is_threshold: float | str | None = doc(
        2.0, "IS bound: a number truncates the weights there; 'lower_upper' (IcePop) zeroes weights outside"
    )
    rollout_rs: str | None = doc(None, "rejection options, comma separated (token_k1, seq_mean_k3, ...); null: none")
    rollout_rs_threshold: float | str | None = doc(
        None, "rejection bounds: one for all options or one per option (k1: 'lower_upper' ratios; k2/k3: upper)"
    )
    bypass_mode: bool = doc(False, "pi_old is the rollout's log-probs (no recomputation); weights per micro-batch")
    loss_type: str = doc("ppo_clip", "bypass mode's loss: ppo_clip or reinforce")
    rollout_is_batch_normalize: bool = doc(False, "divide the IS weights by their batch mean")

    def __post_init__(self):
        """veRL checks nothing when the section is built (``check_values`` does, when a yaml is read, and
        the parsed values below when they are used); a valid ``rollout_rs`` is written canonically."""
        if self.rollout_rs is not None:
            with contextlib.suppress(ConfigError):
                object.__setattr__(self, "rollout_rs", normalise_rs_options(self.rollout_rs))

    def check_values(self) -> None:
        if self.rollout_is is not None and self.rollout_is not in IS_LEVELS:
            raise ConfigError(f"{_P}.rollout_is={self.rollout_is!r} is not one of null, {', '.join(IS_LEVELS)}")
        if self.rollout_is is not None and self.rollout_is_threshold is None:
            raise ConfigError(
                f"{_P}.rollout_is={self.rollout_is} needs {_P}.rollout_is_threshold "
                "(e.g. 2.0 for truncation, '0.5_5.0' for IcePop)"
            )
        if self.rollout_is_threshold is not None:
            parse_is_threshold(self.rollout_is_threshold, f"{_P}.rollout_is_threshold")
        if self.rollout_rs is not None:
            object.__setattr__(self, "rollout_rs", normalise_rs_options(self.rollout_rs, f"{_P}.rollout_rs"))
            parse_rejection_options(self.rollout_rs, self.rollout_rs_threshold, f"{_P}.rollout_rs")
        check_one_of(f"{_P}.loss_type", self.loss_type, LOSS_TYPES)
        for key in ("bypass_mode", "rollout_is_batch_normalize"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{_P}.{key} must be true or false, got {getattr(self, key)!r}")

    # ---- parsed values (the section was checked when built)
    @property
    def is_bounds(self) -> tuple[float, float | None]:
        """(upper, lower) of the IS weights; lower is set for IcePop."""
        if self.rollout_is_threshold is None:
            return 2.0, None
        return parse_is_threshold(self.rollout_is_threshold, f"{_P}.rollout_is_threshold")

    @property
    def rejection(self) -> tuple[RejectionOption, ...]:
        if self.rollout_rs is None:
            return ()
        return parse_rejection_options(self.rollout_rs, self.rollout_rs_threshold, f"{_P}.rollout_rs")

    # ---- veRL's presets: decoupled_* keep pi_old (three policies), bypass_* use the rollout's log-probs
    def _bypass(self, loss_type: str) -> RolloutCorrectionConfig:
        """This preset in bypass mode: the same weights and rejection, pi_old = the rollout's log-probs."""
        return dataclasses.replace(self, bypass_mode=True, loss_type=loss_type)

    @classmethod
    def disabled(cls) -> RolloutCorrectionConfig:
        """Metrics only: no weights, no rejection."""
        return _preset(cls, None)

    @classmethod
    def decoupled_token_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Token-level truncated IS (Token-TIS)."""
        return _preset(cls, "token", threshold)

    @classmethod
    def decoupled_seq_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Sequence-level truncated IS (Seq-TIS)."""
        return _preset(cls, "sequence", threshold)

    @classmethod
    def decoupled_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        """Token-level IcePop: weights outside [threshold_lower, threshold] become 0."""
        return _preset(cls, "token", f"{threshold_lower}_{threshold}")

    @classmethod
    def decoupled_seq_is_rs(cls, is_threshold: float = 2.0, rs_threshold: Bound = "0.5_2.0") -> RolloutCorrectionConfig:
        """Seq-TIS plus rejection on the sequence's ratio product (Seq-MIS)."""
        return _preset(cls, "sequence", is_threshold, "seq_sum_k1", rs_threshold)

    @classmethod
    def decoupled_geo_rs(cls, rs_threshold: Bound = _GEO) -> RolloutCorrectionConfig:
        """Rejection on the geometric-mean ratio (Geo-RS), no weights."""
        return _preset(cls, None, 2.0, "seq_mean_k1", rs_threshold)

    @classmethod
    def decoupled_geo_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: Bound = _GEO) -> RolloutCorrectionConfig:
        """Geo-RS plus Seq-TIS."""
        return _preset(cls, "sequence", is_threshold, "seq_mean_k1", rs_threshold)

    @classmethod
    def decoupled_geo_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold: Bound = _GEO
    ) -> RolloutCorrectionConfig:
        """Geo-RS plus Token-TIS."""
        return _preset(cls, "token", is_threshold, "seq_mean_k1", rs_threshold)

    @classmethod
    def decoupled_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """Rejection on the sequence-mean K3 divergence, no weights."""
        return _preset(cls, None, 2.0, "seq_mean_k3", rs_threshold)

    @classmethod
    def decoupled_k3_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """K3 rejection plus Seq-TIS."""
        return _preset(cls, "sequence", is_threshold, "seq_mean_k3", rs_threshold)

    @classmethod
    def decoupled_k3_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold: float = 0.01
    ) -> RolloutCorrectionConfig:
        """K3 rejection plus Token-TIS."""
        return _preset(cls, "token", is_threshold, "seq_mean_k3", rs_threshold)

    @classmethod
    def bypass_ppo_clip(cls) -> RolloutCorrectionConfig:
        """Bypass mode, PPO clip on pi_theta/pi_rollout (the ratio is the correction)."""
        return _preset(cls, None)._bypass("ppo_clip")

    @classmethod
    def bypass_ppo_clip_geo_rs(cls, rs_threshold: Bound = _GEO) -> RolloutCorrectionConfig:
        """Bypass PPO clip plus Geo-RS."""
        return cls.decoupled_geo_rs(rs_threshold)._bypass("ppo_clip")

    @classmethod
    def bypass_ppo_clip_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """Bypass PPO clip plus K3 rejection."""
        return cls.decoupled_k3_rs(rs_threshold)._bypass("ppo_clip")

    @classmethod
    def bypass_pg_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE with Seq-TIS weights."""
        return cls.decoupled_seq_is(threshold)._bypass("reinforce")

    @classmethod
    def bypass_pg_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE with token-level IcePop weights."""
        return cls.decoupled_token_icepop(threshold, threshold_lower)._bypass("reinforce")

    @classmethod
    def bypass_pg_geo_rs(cls, rs_threshold: Bound = _GEO) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE plus Geo-RS."""
        return cls.decoupled_geo_rs(rs_threshold)._bypass("reinforce")

    @classmethod
    def bypass_pg_geo_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: Bound = _GEO) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE plus Geo-RS and Seq-TIS."""
        return cls.decoupled_geo_rs_seq_tis(is_threshold, rs_threshold)._bypass("reinforce")

    @classmethod
    def bypass_pg_geo_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold: Bound = _GEO
    ) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE plus Geo-RS and Token-TIS."""
        return cls.decoupled_geo_rs_token_tis(is_threshold, rs_threshold)._bypass("reinforce")


def _preset(
    cls: type, rollout_is: str | None, is_threshold: Any = 2.0, rs: str | None = None, rs_threshold: Bound = None
):
    return cls(
        rollout_is=rollout_is, rollout_is_threshold=is_threshold, rollout_rs=rs, rollout_rs_threshold=rs_threshold
    )
