"""The ``reward`` section (veRL 0.9.1's RewardConfig): the reward function or manager, the reward
model, and the code sandbox. The earlier spellings (top-level reward_model, custom_reward_function,
sandbox_fusion, reward_manager) are declared in ``hybridflow.config.legacy``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hybridflow.config.base import BaseConfig, doc, placed, section
from hybridflow.config.errors import ConfigError
from hybridflow.config.module import ModuleConfig
from hybridflow.config.reasons import CPU_NO_CHUNKED_PREFILL, JUDGE, JUDGE_VLLM
from hybridflow.config.rollout import NOT_ENGINES, RolloutConfig, is_user_engine, rollout_as_in_yaml
from hybridflow.config.rules import Problems
from hybridflow.config.status import OrYours, honoured, noted, refused

__all__ = [
    "CustomRewardFunctionConfig",
    "RewardManagerConfig",
    "SandboxFusionConfig",
    "RewardModelConfig",
    "RewardConfig",
    "engine_only",
    "standalone_engine",
    "ENGINE_KEYS",
]

_RM_POOL = "a separate reward-model pool is not implemented; the reward model runs on the trainer's devices"


# the inference-engine keys every standalone engine section keeps (the reward model's and the teachers')
ENGINE_KEYS = tuple(
    "name dtype gpu_memory_utilization enforce_eager cudagraph_capture_sizes free_cache_engine data_parallel_size "
    "expert_parallel_size tensor_model_parallel_size max_num_batched_tokens max_model_len max_num_seqs load_format "
    "engine_kwargs limit_images enable_chunked_prefill enable_prefix_caching disable_log_stats skip_tokenizer_init "
    "prompt_length response_length temperature".split()
)


def engine_only(keep: tuple[str, ...] = ENGINE_KEYS) -> tuple[str, ...]:
    """The RolloutConfig keys a standalone inference engine's section leaves out (it keeps ``keep``)."""
    return tuple(f.name for f in dataclasses.fields(RolloutConfig) if f.name not in keep and f.name != "_target_")


@dataclass
class CustomRewardFunctionConfig(BaseConfig):
    """``reward.custom_reward_function``: a scoring function of yours."""

    path: str | None = doc(None, "a .py file; null uses the built-in scorers")
    name: str = doc("compute_score", "the function in it")
    reward_kwargs: dict = doc({}, "hybridflow: extra keyword arguments bound to the function")


@dataclass
class RewardManagerConfig(BaseConfig):
    """``reward.reward_manager``: how scores are computed from the samples."""

    _target_: str = doc("verl.workers.config.reward.RewardManagerConfig", "the class this section is read into")
    source: str = doc(
        "register",
        "register (name: in the reward-manager registry) | importlib (name: the class in module.path); a class "
        "of veRL 0.9's reward loop (a RewardManagerBase with run_single) runs as veRL runs it",
        values=("register", "importlib"),
    )
    name: str = doc("naive", "name in the reward-manager registry, or the class in module")
    module: ModuleConfig | None = section(
        placed(ModuleConfig, _target_="verl.trainer.config.config.ModuleConfig", name="custom_reward_manager"),
        "the file of an importlib reward manager",
        keys={"name": noted("hybridflow names the loaded module after its file")},
    )

    def validate(self) -> None:
        if self.source == "importlib" and not (self.module is not None and self.module.path):
            raise ConfigError(
                "reward.reward_manager.source=importlib needs reward.reward_manager.module.path (the file that "
                f"defines the class {self.name})"
            )


@dataclass
class SandboxFusionConfig(BaseConfig):
    """``reward.sandbox_fusion``: a code-execution sandbox for code rewards."""

    _target_: str = doc("verl.workers.config.SandboxFusionConfig", "the class this section is read into")
    url: str | None = doc(
        None,
        "a SandboxFusion service's run_code endpoint (http://host:port/run_code): the built-in code scorer "
        "(data sources codecontests, apps, taco, codeforces) runs its tests there; null: in hybridflow's local "
        "sandbox. Not used with reward.custom_reward_function.path or a judge manager (as in veRL)",
    )
    max_concurrent: int = doc(64, "requests in flight at once (hybridflow: per scoring process)")
    memory_limit_mb: int = doc(1024, "memory per sandbox process, in MB")

    def validate(self) -> list[str]:
        """ConfigError naming the key when the service cannot be addressed; a note when the service's settings
        are set without a service (veRL reads them only with url too)."""
        if self.url is not None and not str(self.url).startswith(("http://", "https://")):
            raise ConfigError(f"reward.sandbox_fusion.url={self.url!r} must be an http:// or https:// URL")
        if self.url and int(self.max_concurrent) < 1:
            raise ConfigError(f"reward.sandbox_fusion.max_concurrent={self.max_concurrent} must be >= 1")
        unused = [
            f"reward.sandbox_fusion.{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if f.name in ("max_concurrent", "memory_limit_mb") and getattr(self, f.name) != f.default
        ]
        if unused and not self.url:
            why = "not used without reward.sandbox_fusion.url (the local sandbox's limits are the code scorer's own)"
            return [f"{', '.join(unused)}: {why}"]
        return []


_RM_ENGINE_KEYS = (
    *ENGINE_KEYS,
    *"pipeline_model_parallel_size layered_summon scheduling_policy full_determinism seed multi_stage_wake_up "
    "ignore_eos top_k top_p do_sample n quantization quantization_config_file mtp disaggregation".split(),
)


def standalone_engine(**values: Any) -> RolloutConfig:
    """An inference engine section of its own (the reward model's, a teacher's) as veRL's yaml holds it."""
    own = {"enforce_eager": True, "tensor_model_parallel_size": 2, "max_num_seqs": 1024, "load_format": "auto"}
    return rollout_as_in_yaml(**{**own, "engine_kwargs": {}, **values})


_reward_engine = placed(
    standalone_engine,
    name=None,
    dtype="bfloat16",
    skip_tokenizer_init=False,
    prompt_length=2048,
    response_length=2048,
    mtp=None,
)


@dataclass
class RewardModelConfig(BaseConfig):
    """``reward.reward_model``: a model that scores the samples: a sequence classifier, or an LLM judge served on
    a rollout engine (reward.reward_manager.name=genrm)."""

    _target_: str = doc("verl.workers.config.RewardModelConfig", "the class this section is read into")
    enable: bool = doc(False, "score with a reward model (false: rule-based scorers only)")
    enable_resource_pool: bool = doc(False, "the reward model gets devices of its own", refused=_RM_POOL)
    n_gpus_per_node: int = doc(8, "devices per node of that pool", refused=_RM_POOL)
    nnodes: int = doc(0, "nodes of that pool", refused=_RM_POOL)
    model_path: str | None = doc(None, "a sequence classifier (scored with FSDP), or the judge's causal LM (genrm)")
    rollout: RolloutConfig = section(
        _reward_engine,
        "the engine serving a generative reward model (genrm: hf | vllm)",
        follows={"mtp": None},
        absent=(*engine_only(_RM_ENGINE_KEYS), "disaggregation.mooncake_protocol"),
        keys={
            "name": honoured(
                JUDGE + "; null: no engine (hybridflow's default); or an AsyncRolloutServer of yours, as rollout.name",
                values=OrYours((None, "hf", "vllm"), also=is_user_engine),
            ),
            **dict.fromkeys(
                "temperature top_k top_p seed prompt_length response_length dtype ignore_eos max_num_seqs "
                "do_sample".split(),
                honoured(
                    JUDGE + "; a judge prompt longer than prompt_length is not sent (it scores "
                    "reward.reward_kwargs.unparsable_score and counts in genrm/prompt_too_long)"
                ),
            ),
            **dict.fromkeys(
                "gpu_memory_utilization enforce_eager free_cache_engine tensor_model_parallel_size "
                "max_num_batched_tokens max_model_len load_format disable_log_stats "
                "engine_kwargs engine_kwargs.vllm.**".split(),
                honoured(JUDGE_VLLM),
            ),
            "enable_chunked_prefill": honoured(f"{JUDGE_VLLM}; {CPU_NO_CHUNKED_PREFILL}"),
            "n": honoured("one verdict per response", values=(1,)),
            "skip_tokenizer_init": honoured("hybridflow's judge client tokenizes", values=(False,)),
            **dict.fromkeys(("engine_kwargs.sglang.**", "engine_kwargs.trtllm.**"), refused(NOT_ENGINES)),
        },
    )


@dataclass
class RewardConfig(BaseConfig):
    """``reward``: how samples are scored."""

    _target_: str = doc("verl.workers.config.RewardConfig", "the class this section is read into")
    num_workers: int = doc(
        8,
        "processes that score each trajectory as it finishes, overlapping generation (hybridflow: "
        "ceil(num_workers / rollout.agent.num_workers) per agent loop worker; 0: the driver scores the batch "
        "after generation); managers batch and genrm, and a reward model, always score after generation",
    )
    custom_reward_function: CustomRewardFunctionConfig = section(
        CustomRewardFunctionConfig, "a scoring function of yours"
    )
    reward_manager: RewardManagerConfig = section(RewardManagerConfig, "how scores are computed")
    reward_model: RewardModelConfig = section(RewardModelConfig, "a reward model")
    sandbox_fusion: SandboxFusionConfig = section(SandboxFusionConfig, "a code-execution service for code rewards")
    reward_kwargs: dict = doc({}, "keyword arguments of the reward manager (added with +reward.reward_kwargs.<key>)")
    bad_sample_score: float | None = doc(
        None,
        "hybridflow: the score of a sample whose reward function raised, returned NaN/None or ran past "
        "score_timeout_s (each logged, counted in reward/bad_samples); null: the step fails naming the sample",
    )
    score_timeout_s: float | None = doc(
        60.0,
        "hybridflow: seconds the reward function may take on one sample (batch manager: its one call gets "
        "this × the batch's samples); past it the sample is bad; null: no deadline, called in the driver's thread",
    )

    def validate(self, judge_scored: bool) -> list[str]:
        """The reward model's settings for the manager chosen; ``judge_scored``: reward_manager.name grades
        with a judge model (the registry's answer). A judge needs a model and an engine to serve it; a
        discriminative model is scored by the FSDP worker, which veRL's engine keys (``reward_model.rollout.*``,
        set by veRL's reward-loop examples) do not reach. Raises ConfigError listing every problem."""
        p, rm, ro = Problems(), "reward.reward_model", "reward.reward_model.rollout"
        model, engine, function = self.reward_model, self.reward_model.rollout, self.custom_reward_function.path
        p.run(self.sandbox_fusion.validate)
        p.run(self.reward_manager.validate)
        if self.reward_manager.name == "remote" and self.reward_manager.source != "importlib" and self.num_workers < 1:
            p.errors.append(
                f"reward.reward_manager.name=remote scores in reward.num_workers processes: set it >= 1 "
                f"(got {self.num_workers})"
            )
        if self.sandbox_fusion.url and (function or judge_scored):
            instead = "reward.custom_reward_function.path" if function else f"the {self.reward_manager.name} judge"
            p.notes.append(
                f"reward.sandbox_fusion.url={self.sandbox_fusion.url} is not used: {instead} scores the samples and "
                "only the built-in code scorer sends code to the service (veRL's rule)"
            )
        if not judge_scored:
            if model.enable and engine.name is not None and function:
                p.errors.append(
                    f"{rm}.enable=True with {ro}.name={engine.name} and reward.custom_reward_function.path: veRL's "
                    "GenRM pattern, where the function posts to the reward model's HTTP router "
                    "(reward_router_address); hybridflow serves no HTTP router. Use reward.reward_manager.name=genrm "
                    "(its template and verdict parser in reward.reward_kwargs) and no custom function"
                )
            elif model.enable and engine.name is not None:
                p.notes.append(
                    f"{ro}.name={engine.name}: {rm}.model_path is scored as a discriminative (sequence-classification) "
                    f"reward model by hybridflow's FSDP worker, which does not read {ro}.*; an engine serves a "
                    f"generative reward model only (reward.reward_manager.name=genrm)"
                )
            return p.raise_errors()
        where, tp = f"reward.reward_manager.name={self.reward_manager.name}", engine.tensor_model_parallel_size
        if not model.enable:
            p.errors.append(
                f"{where} grades with a judge model: set {rm}.enable=True, {rm}.model_path and {ro}.name (hf or vllm)"
            )
        if not model.model_path:
            p.errors.append(f"{where} needs {rm}.model_path: the judge's model (a causal LM directory)")
        if engine.name not in ("hf", "vllm") and not is_user_engine(engine.name):
            p.errors.append(
                f"{where} needs {ro}.name set to an engine that serves the judge: hf, vllm or yours "
                f"(got {engine.name!r})"
            )
        if function:
            p.errors.append(f"{where} scores with the judge: reward.custom_reward_function.path must be null")
        if engine.name == "vllm" and tp > 1:
            p.errors.append(
                f"{ro}.tensor_model_parallel_size={tp}: the judge runs one engine in each trainer "
                "worker, which sees one device; set it to 1"
            )
        elif engine.name == "hf" and tp != _reward_engine().tensor_model_parallel_size:
            p.notes.append(f"{ro}.tensor_model_parallel_size={tp} is ignored: the hf engine does not shard")
        if str(engine.load_format or "").startswith("dummy"):
            p.errors.append(
                f"{ro}.load_format={engine.load_format}: the judge never receives weights, "
                "so it must load its own (auto)"
            )
        if engine.do_sample and engine.temperature <= 0:
            p.errors.append(
                f"{ro}.do_sample=True needs {ro}.temperature > 0; for a greedy judge set {ro}.do_sample=False"
            )
        return p.raise_errors()
