"""The rollout section ``actor_rollout_ref.rollout`` (veRL's RolloutConfig and its sub-sections):
the inference engine (hf or vllm), sampling, the agent loop and multi-turn settings, and how weights
reach the engine."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hybridflow.config.base import BaseConfig, doc, placed, section, unset
from hybridflow.config.engine import QATEngineConfig
from hybridflow.config.errors import ConfigError, check_at_least, check_one_of
from hybridflow.config.model import MtpConfig
from hybridflow.config.profiler import HOOK_KEYS, TOOL_NAME_KEYS, ProfilerConfig
from hybridflow.config.reasons import CPU_NO_CHUNKED_PREFILL, TARGET, VLLM_ENGINE, VLM, speed_only
from hybridflow.config.rules import Problems
from hybridflow.config.status import OrYours, honoured, refused

__all__ = [
    "SamplingConfig",
    "MultiTurnConfig",
    "CustomAsyncServerConfig",
    "AgentLoopConfig",
    "CheckpointEngineConfig",
    "TraceConfig",
    "PrometheusConfig",
    "DisaggregationConfig",
    "ServerConfig",
    "RolloutConfig",
    "rollout_as_in_yaml",
]

_BOTH_ROLLOUTS = "read by both rollouts (hf: the per-request sampling seed's base / the largest decode batch)"
_ENGINE_SPEED = speed_only("CUDA graphs, prefix caching, staged weight loading")
_NOT_IMPLEMENTED = "this rollout-engine feature is not implemented"
_QUANTIZED = "quantized / speculative rollout is not implemented"
_ONE_PIPELINE = "both run the asynchronous server + agent loop pipeline (veRL 0.9.1 removed sync)"
NOT_ENGINES = "sglang and TensorRT-LLM are not hybridflow rollout engines"
_PROFILER_ABSENT = ("tool_config.nsys", "tool_config.torch_memory", "tool_config.torch.schedule", *TOOL_NAME_KEYS)
_TP_ONLY = "only tensor parallelism is implemented inside a rollout engine"
SGLANG = "an SGLang-only option; SGLang is not a hybridflow rollout engine (use rollout.name=vllm or hf)"
_UNREAD = "veRL 0.9.1 declares it but does not read it either"


# names registered with hybridflow.rollout.register_rollout_server in this process (it adds them here: the
# config sits below the rollout package and does not import it)
REGISTERED_ENGINES: set[str] = set()


def is_user_engine(name: Any) -> bool:
    """A rollout engine of the user's: a class reference (checked when the run starts, imported where the engine
    runs), or a name registered in this process."""
    return isinstance(name, str) and ("." in name or ":" in name or name in REGISTERED_ENGINES)


_CUSTOM = (
    "custom async rollout servers / agent loop managers / checkpoint engine managers are not implemented "
    "(hybridflow's server is the hf or vllm engine)"
)

ROLLOUT_MODES = ("sync", "async")
TRUNCATE_SIDES = ("left", "middle", "right")
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")
# Settings the hf rollout does not read (they configure vLLM's engine); not seed (the hf rollout's sampling
# seeds derive from it) nor max_num_seqs (its largest batch)
_VLLM_ONLY_KEYS = (
    "gpu_memory_utilization enforce_eager free_cache_engine load_format max_num_batched_tokens max_model_len "
    "enable_chunked_prefill disable_log_stats calculate_log_probs"
).split()


_AP = "actor_rollout_ref.actor.profiler"
_GT = "global_profiler.global_tool_config"
# the rollout profiles when the actor does: its switches follow the actor's
_ROLLOUT_PROFILER = {
    **{k: f"${{{_AP}.{k}}}" for k in ("enable", "all_ranks", "ranks", *HOOK_KEYS)},
    **{
        f"tool_config.npu.{k}": f"${{{_AP}.tool_config.npu.{k}}}" for k in ("contents", "level", "analysis", "discrete")
    },
    **{f"tool_config.torch.{k}": f"${{{_AP}.tool_config.torch.{k}}}" for k in ("contents", "discrete")},
    **{
        f"tool_config.precision_debugger.{k}": f"${{oc.select:{_AP}.tool_config.precision_debugger.{k},${{{_GT}.precision_debugger.{k}}}}}"  # noqa: E501
        for k in ("config_path", "stages", "strict")
    },
}


@dataclass
class SamplingConfig(BaseConfig):
    """``rollout.val_kwargs``: sampling used for validation."""

    _target_: str = doc("verl.workers.config.SamplingConfig", "the class this section is read into")
    top_k: int = doc(-1, "top-k filter; -1 or 0: none")
    top_p: float = doc(1.0, "nucleus filter")
    temperature: float = doc(1.0, "sampling temperature (0 with do_sample false: greedy)")
    n: int = doc(1, "samples per validation prompt")
    do_sample: bool = doc(True, "sample (else greedy)")


@dataclass
class MultiTurnConfig(BaseConfig):
    """``rollout.multi_turn``: the tool_agent loop's limits, tools and interactions."""

    _mutable_fields = {"max_assistant_turns", "max_user_turns"}

    _target_: str = doc("verl.workers.config.MultiTurnConfig", "the class this section is read into")
    enable: bool = doc(False, "this run is multi-turn (the start-up checks require something multi-turn configured)")
    max_assistant_turns: int | None = doc(None, "model turns per trajectory (null: no limit)")
    tool_config_path: str | None = doc(None, "veRL-format tool yaml (tools: [{class_name, config, tool_schema}])")
    function_tool_path: str | None = doc(
        None, "a Python file of @function_tool functions (hybridflow.tools.function_tool), tools beside the yaml's"
    )
    max_user_turns: int | None = doc(None, "tool-result and interaction turns per trajectory (null: no limit)")
    interaction_config_path: str | None = doc(None, "veRL-format interaction yaml")
    max_parallel_calls: int = doc(1, "tool calls of one model turn that run; the rest are dropped")
    max_tool_response_length: int = doc(256, "characters of a tool's answer kept")
    tool_response_truncate_side: str = doc("middle", "left (keep the end) | middle | right (keep the start)")
    use_inference_chat_template: bool = doc(False, "re-apply the chat template to each turn's engine prompt")
    tokenization_sanity_check_mode: str = doc("strict", "strict | ignore_strippable | disable: check the re-template")
    format: str = doc(
        "hermes",
        "tool-call format",
        reason="a registered tool-call parser (built in: hermes, qwen3_coder, gpt-oss, glm, seed, minimax, kimi, "
        "deepseek_v4, gemma4)",
    )
    num_repeat_rollouts: int | None = doc(None, "unread", note=_UNREAD)
    tool_call_timeout: float = doc(60, "seconds one tool call may take before the model gets a timeout message")

    def check_values(self) -> None:  # veRL's MultiTurnConfig checks nothing when built
        p = "actor_rollout_ref.rollout.multi_turn"
        for key, allowed in (
            ("tool_response_truncate_side", TRUNCATE_SIDES),
            ("tokenization_sanity_check_mode", SANITY_CHECK_MODES),
        ):
            check_one_of(f"{p}.{key}", getattr(self, key), allowed)
        check_at_least(p, self, ("max_parallel_calls", "max_tool_response_length"), 1)
        check_at_least(p, self, ("max_assistant_turns", "max_user_turns"), 0, nullable=True)
        if self.tool_call_timeout <= 0:
            raise ConfigError(f"{p}.tool_call_timeout must be > 0, got {self.tool_call_timeout}")


@dataclass
class CustomAsyncServerConfig(BaseConfig):
    """``rollout.agent.custom_async_server``: declared by veRL 0.9.1, read nowhere there (nor here). An engine of
    your own: ``rollout.name=my_engine.py:MyServer`` (an ``AsyncRolloutServer``, hybridflow.rollout)."""

    _target_: str = doc("verl.workers.config.CustomAsyncServerConfig", "the class this section is read into")
    path: str | None = doc(None, "file of a custom async rollout server", note=_UNREAD)
    name: str | None = doc(None, "its class name", note=_UNREAD)


@dataclass
class AgentLoopConfig(BaseConfig):
    """``rollout.agent``: the agent-loop workers every rollout runs through."""

    _target_: str = doc("verl.workers.config.AgentLoopConfig", "the class this section is read into")
    num_workers: int = doc(8, "hybridflow: 2 (veRL: 8); agent-loop workers (one process each) the batch is spread over")
    default_agent_loop: str = doc("single_turn_agent", "loop of a sample without agent_name")
    agent_loop_config_path: str | None = doc(None, "your loops: a yaml list of {name, _target_, **kwargs}")
    custom_async_server: CustomAsyncServerConfig = section(CustomAsyncServerConfig, "a custom server (unread)")
    agent_loop_manager_class: str | None = doc(None, "your agent loop manager class", refused=_CUSTOM)

    def check_values(self) -> None:  # veRL's AgentLoopConfig checks nothing when built
        check_at_least("rollout.agent", self, ("num_workers",), 1)


@dataclass
class CheckpointEngineConfig(BaseConfig):
    """``rollout.checkpoint_engine``: how new weights travel from the trainer to the engines."""

    _mutable_fields = {"backend"}

    _target_: str = doc("verl.workers.config.CheckpointEngineConfig", "the class this section is read into")
    backend: str | None = doc("naive", "naive (in process or through Ray's object store)")
    update_weights_bucket_megabytes: int = doc(2048, "size of one weight bucket")
    engine_kwargs: dict = doc({}, "backend arguments")
    custom_backend_module: str | None = doc(None, "a module of your own backend (not implemented)")


# veRL's trace backends hybridflow does not implement
UNIMPLEMENTED_TRACE_BACKENDS = {"weave": "Weights & Biases Weave", "trackio": "Trackio"}


@dataclass
class TraceConfig(BaseConfig):
    """``rollout.trace``: each agent-loop trajectory recorded in a tracing store (hybridflow/agent_loop/trace.py)."""

    _target_: str = doc("verl.workers.config.TraceConfig", "the class this section is read into")
    project_name: str | None = doc(None, "mlflow experiment of the traces", follows="${trainer.project_name}")
    experiment_name: str | None = doc(None, "tag of every trace", follows="${trainer.experiment_name}")
    backend: str | None = doc(
        None,
        "null (no tracing) | mlflow",
        reason="null or mlflow (extra [trace]): one trace per trajectory in $MLFLOW_TRACKING_URI or "
        "sqlite:///<trainer.default_local_dir>/mlflow.db; weave and trackio are not implemented",
    )
    token2text: bool = doc(False, "traces also hold the decoded prompt_text and response_text")
    max_samples_per_step_per_worker: int | None = doc(None, "prompts traced per call and agent-loop worker; null: all")

    def __post_init__(self):  # veRL's check when built
        check_at_least("actor_rollout_ref.rollout.trace", self, ("max_samples_per_step_per_worker",), 0, nullable=True)

    def check_values(self) -> None:
        if self.backend in UNIMPLEMENTED_TRACE_BACKENDS:
            raise ConfigError(
                f"actor_rollout_ref.rollout.trace.backend={self.backend!r}: the "
                f"{UNIMPLEMENTED_TRACE_BACKENDS[self.backend]} backend is not implemented; use mlflow (pip install "
                "'hybridflow[trace]')"
            )


@dataclass
class PrometheusConfig(BaseConfig):
    """``rollout.prometheus``: the engines' metrics exporter (not implemented)."""

    _target_: str = doc("verl.workers.config.PrometheusConfig", "the class this section is read into")
    enable: bool = doc(False, "export the engines' metrics")
    port: int = doc(9090, "exporter port")
    file: str = doc("/tmp/ray/session_latest/metrics/prometheus/prometheus.yml", "Prometheus configuration file")
    served_model_name: str | None = doc(None, "model name in the metrics", follows="${actor_rollout_ref.model.path}")


@dataclass
class DisaggregationConfig(BaseConfig):
    """``rollout.disaggregation``: prefill/decode disaggregation (not implemented)."""

    enabled: bool = doc(False, "split prefill and decode over separate replicas")
    prefill_replicas: int = doc(1, "prefill replicas")
    decode_replicas: int = doc(1, "decode replicas")
    decode_tensor_model_parallel_size: int | None = doc(None, "tensor parallel size of decode")
    transfer_backend: str = doc("nixl", "KV transfer backend")
    bootstrap_port: int | None = doc(None, "bootstrap port")
    ib_device: str | None = doc(None, "InfiniBand device")
    mooncake_protocol: str = doc("nvlink", "Mooncake KV transfer protocol")


@dataclass
class ServerConfig(BaseConfig):
    """``rollout.server``: SGLang's HTTP server mode (SGLang is not a hybridflow rollout engine)."""

    timeout: float = doc(60.0, "seconds one request may take")
    max_attempts: int = doc(3, "tries of a request")
    retry_delay: float = doc(2.0, "seconds between tries")
    max_connections: int = doc(1000, "connections at once")
    max_start_wait_time: float = doc(300.0, "seconds the server may take to start")


def cpu_tensor_parallel_error(tp: int, key: str = "rollout.tensor_model_parallel_size") -> str | None:
    """The rule's one home (start-up checks and the vllm engine's settings ask it): tensor parallelism
    needs GPUs; on cpu each rollout worker runs its own engine."""
    if tp <= 1:
        return None
    return (
        f"{key}={tp}: tensor parallelism needs GPUs; the vllm rollout on cpu runs one engine process per "
        "worker; use tensor_model_parallel_size=1 on cpu"
    )


@dataclass
class RolloutConfig(BaseConfig):
    """``actor_rollout_ref.rollout``: the inference engine and how it samples."""

    # the worker sizes the engine for the model it serves (veRL's mutable fields)
    _mutable_fields = set(
        "max_model_len load_format engine_kwargs prompt_length response_length expert_parallel_size "
        "moe_tensor_parallel_size full_determinism max_num_seqs".split()
    )

    _target_: str = doc("verl.workers.config.RolloutConfig", "the class this section is read into")
    name: str | None = doc(
        "???",
        "hybridflow: hf (transformers, cpu and GPU; veRL requires a value) | vllm (the [vllm] extra) | yours",
        values=OrYours(("hf", "vllm"), also=is_user_engine),
        reason="hybridflow's rollout engines are hf (transformers) and vllm, or an engine of yours (an "
        "AsyncRolloutServer: its class as package.module.Class or file.py:Class, or a name registered with "
        "register_rollout_server in this process); SGLang is not a hybridflow rollout engine, nor TensorRT-LLM "
        "(veRL's sglang_multiturn examples run on vllm or hf through the agent loop)",
    )
    mode: str = doc("async", "async | sync (hybridflow: the same pipeline)", values=ROLLOUT_MODES, reason=_ONE_PIPELINE)
    nnodes: int = doc(0, "> 0: the engines get a pool of their own; 0: colocated with the actor")
    n_gpus_per_node: int = doc(8, "devices per node of that pool (follows trainer.n_gpus_per_node)")
    temperature: float = doc(1.0, "sampling temperature")
    top_k: int = doc(-1, "top-k filter; -1 or 0: none")
    top_p: float = doc(1.0, "nucleus filter")
    full_determinism: bool = doc(
        False,
        "results independent of batch company and timing (slower)",
        reason="hf: one sequence decoded at a time (each request's sampling is seeded from seed and its id) and "
        "deterministic kernels in the worker; vllm: VLLM_BATCH_INVARIANT=1 in the engine's processes (CUDA only)",
    )
    seed: int = doc(42, "base of the per-request sampling seeds", reason=_BOTH_ROLLOUTS)
    prompt_length: int = doc(512, "prompt tokens (follows data.max_prompt_length)")
    response_length: int = doc(512, "generated tokens at most (follows data.max_response_length)")
    dtype: str = doc("bfloat16", "engine dtype; hybridflow: auto (bf16 on CUDA, fp32 on cpu) or a dtype")
    gpu_memory_utilization: float = doc(0.5, "vllm: device memory share for weights + KV cache", reason=VLLM_ENGINE)
    ignore_eos: bool = doc(False, "keep generating after EOS")
    enforce_eager: bool = doc(False, "vllm: no CUDA graphs", reason=VLLM_ENGINE)
    cudagraph_capture_sizes: list[int] | None = doc(None, "vllm: batch sizes run as CUDA graphs", note=_ENGINE_SPEED)
    free_cache_engine: bool = doc(True, "release the KV cache between generation phases", reason=VLLM_ENGINE)
    tensor_model_parallel_size: int = doc(
        2, "vllm: tensor parallel size (hybridflow: 1, one device)", reason=VLLM_ENGINE
    )
    data_parallel_size: int = doc(1, "data parallel size inside an engine (hybridflow: 1)", refused=_TP_ONLY)
    expert_parallel_size: int = doc(1, "expert parallel size inside an engine (hybridflow: 1)", refused=_TP_ONLY)
    pipeline_model_parallel_size: int = doc(1, "pipeline parallel size inside an engine", refused=_TP_ONLY)
    max_num_batched_tokens: int = doc(8192, "vllm: tokens per scheduler step", reason=VLLM_ENGINE)
    max_model_len: int | None = doc(None, "vllm: context length (null: prompt + response length)", reason=VLLM_ENGINE)
    max_num_seqs: int = doc(1024, "sequences decoded at once", reason=_BOTH_ROLLOUTS)
    enable_chunked_prefill: bool = doc(
        True,
        "vllm: chunked prefill",
        reason=f"read by the vllm rollout on a GPU; {CPU_NO_CHUNKED_PREFILL}; the hf rollout ignores it (config checks "
        "print a note)",
    )
    enable_prefix_caching: bool = doc(True, "vllm: prefix caching", note=_ENGINE_SPEED)
    logprobs_mode: str | None = doc(
        "processed_logprobs", "after temperature", values=("processed_logprobs",), reason="log softmax(logits / T)"
    )
    scheduling_policy: str | None = doc("fcfs", "engine scheduling (hybridflow: fcfs)", refused=_NOT_IMPLEMENTED)
    load_format: str = doc("dummy", "vllm: initial weights (dummy: pushed from the trainer)", reason=VLLM_ENGINE)
    layered_summon: bool = doc(False, "gather FSDP weights layer by layer (speed only)", note=_ENGINE_SPEED)
    log_prob_micro_batch_size: int | None = doc(None, "deprecated global micro-batch of the old log-prob pass")
    log_prob_micro_batch_size_per_gpu: int | None = doc(None, "samples per forward of the old log-prob pass")
    log_prob_use_dynamic_bsz: bool = doc(False, "pack by token count (follows actor.use_dynamic_bsz)")
    log_prob_max_token_len_per_gpu: int = doc(16384, "tokens per forward (follows actor.ppo_max_token_len_per_gpu)")
    disable_log_stats: bool = doc(True, "vllm: no periodic stats logging", reason=VLLM_ENGINE)
    do_sample: bool = doc(True, "sample (else greedy)")
    n: int = doc(1, "responses sampled per prompt; > 1 for grpo and rloo")
    over_sample_rate: float = doc(
        0.0,
        "training: keep the first int(N*(1-rate)) trajectories to finish, pad the rest; 0: keep all",
        reason="synchronous training batches: the slowest trajectories are aborted and padded (response_mask 0), as "
        "veRL's SGLang rollout did (veRL 0.9.1 declares the key but reads it nowhere)",
    )
    multi_stage_wake_up: bool = doc(False, "wake weights and KV cache in stages (speed only)", note=_ENGINE_SPEED)
    engine_kwargs: dict = doc(
        {},
        "engine arguments as they are (vllm.kv_cache_memory_bytes null on cpu: enough for max_num_seqs, <= 512 MiB)",
        keys={"vllm": honoured(VLLM_ENGINE), **dict.fromkeys(("sglang", "trtllm"), refused(NOT_ENGINES))},
    )
    limit_images: int | None = doc(None, "images per prompt (vision models are not supported)", refused=VLM)
    val_kwargs: SamplingConfig = section(placed(SamplingConfig, temperature=0.0, do_sample=False), "validation's")
    router_config_path: str | None = doc(None, "a router config (not implemented)", refused=_NOT_IMPLEMENTED)
    multi_turn: MultiTurnConfig = section(
        MultiTurnConfig, "tools and interactions", keys={"_target_": refused(TARGET), "**": refused(_NOT_IMPLEMENTED)}
    )
    calculate_log_probs: bool = doc(False, "the engine returns its log-probs of the sampled tokens", reason=VLLM_ENGINE)
    agent: AgentLoopConfig = section(
        placed(AgentLoopConfig, num_workers=2),
        "agent loops",
        keys={
            "_target_": refused(TARGET),
            "custom_async_server._target_": refused(TARGET),
            "**": refused(_NOT_IMPLEMENTED),
        },
    )
    checkpoint_engine: CheckpointEngineConfig = section(
        CheckpointEngineConfig,
        "weight transfer to the engines",
        refused="custom checkpoint engines are not implemented",
        keys={
            "backend": honoured(
                "weights travel in buckets through the worker process (colocated) or Ray's object store (a separate "
                "rollout pool); nccl/nixl/hccl checkpoint engines are not implemented",
                values=("naive",),
            ),
            "update_weights_bucket_megabytes": honoured(),
        },
    )
    trace: TraceConfig = section(
        placed(TraceConfig, project_name="hybridflow_examples", experiment_name="gsm8k"), "trajectory tracing"
    )
    skip_tokenizer_init: bool = doc(True, "vllm: the engine works on token ids only", note=_ENGINE_SPEED)
    skip_rollout: bool = doc(False, "veRL main's spelling of skip.rollout.enable (mapped onto it)")
    skip_dump_dir: str = doc("/tmp/rollout_dump", "veRL main's spelling of skip.rollout.dump_dir (mapped onto it)")
    enable_rollout_routing_replay: bool = doc(False, "record MoE routes in the rollout", refused=_NOT_IMPLEMENTED)
    moe_load_balance_metrics_interval: int = doc(0, "steps between MoE load-balance metrics", refused=_NOT_IMPLEMENTED)
    profiler: ProfilerConfig | None = section(
        unset, "follows the actor's", follows=_ROLLOUT_PROFILER, absent=_PROFILER_ABSENT
    )
    prometheus: PrometheusConfig = section(
        placed(PrometheusConfig, served_model_name="~/models/deepseek-llm-7b-chat"), "metrics", refused=_NOT_IMPLEMENTED
    )
    quantization: str | None = doc(None, "quantized rollout (not implemented)", refused=_QUANTIZED)
    quantization_config_file: str | None = doc(None, "its config file", refused=_QUANTIZED)
    mtp: MtpConfig | None = section(MtpConfig, "MTP speculative decoding (follows model.mtp)", refused=_QUANTIZED)
    qat: QATEngineConfig | None = section(unset, "QAT settings (follows actor.fsdp_config.qat)", refused=_QUANTIZED)
    disaggregation: DisaggregationConfig = section(
        DisaggregationConfig, "prefill/decode split", refused=_NOT_IMPLEMENTED
    )
    repetition_penalty: float = doc(1.0, "penalty of tokens already generated", refused=_NOT_IMPLEMENTED)
    standalone_gpu_memory_utilization: float | None = doc(None, "of a separate rollout pool", refused=_NOT_IMPLEMENTED)
    moe_tensor_parallel_size: int | None = doc(1, "TensorRT-LLM's MoE TP size", refused="a TensorRT-LLM option")
    server: ServerConfig = section(ServerConfig, "SGLang's server mode", refused=SGLANG)
    custom: dict | None = doc(None, "your own settings, read by your code (veRL's extension point)")
    checkpoint_manager_class: str | None = doc(None, "your checkpoint engine manager class", refused=_CUSTOM)
    layer_name_map: dict = doc({}, "weight-name map of the engine (not implemented)", refused=_NOT_IMPLEMENTED)
    sglang_engine_mode: str = doc("local", "SGLang's engine mode", refused=SGLANG)
    enable_sleep_mode: bool = doc(
        True, "vllm: sleep between phases (hybridflow: free_cache_engine)", note=_ENGINE_SPEED
    )

    def __post_init__(self):
        check_one_of("rollout.mode", self.mode, ROLLOUT_MODES)
        check_at_least("rollout", self, ("n", "prompt_length", "response_length"), 1)
        if not 0 <= self.over_sample_rate < 1:
            raise ConfigError(f"rollout.over_sample_rate must be in [0, 1), got {self.over_sample_rate}")

    def validate(self, device: str, path: str = "actor_rollout_ref.rollout") -> list[str]:
        """The engine and sampling keys against each other and the ``device`` (cpu or cuda), and the
        agent-loop settings that would do nothing. Raises ConfigError listing every problem; returns notes."""
        p, tp = Problems(), self.tensor_model_parallel_size
        if self.name == "vllm" and device == "cpu" and tp > 1:
            p.errors.append(cpu_tensor_parallel_error(tp, f"{path}.tensor_model_parallel_size"))
        if self.name == "hf":
            if tp > 1:
                p.notes.append(f"{path}.tensor_model_parallel_size={tp} is ignored: the hf rollout does not shard")
            yaml = rollout_as_in_yaml()
            p.notes += [
                f"{path}.{key}={getattr(self, key)} only configures vLLM; the hf rollout ignores it"
                for key in _VLLM_ONLY_KEYS
                if getattr(self, key) != getattr(yaml, key)
            ]
            if self.do_sample and self.temperature <= 0:
                p.errors.append(f"{path}.do_sample=True needs {path}.temperature > 0; for greedy use do_sample=False")
        if self.val_kwargs.do_sample and self.val_kwargs.temperature <= 0:
            p.errors.append(
                f"{path}.val_kwargs.do_sample=True needs {path}.val_kwargs.temperature > 0 "
                f"(got {self.val_kwargs.temperature})"
            )
        if self.mode == "sync":
            p.notes.append(
                f"{path}.mode=sync: generation always runs through the asynchronous rollout server and "
                "the agent loop (single_turn_agent for plain prompts), as with mode=async; veRL 0.9.1 removed sync"
            )
        if self.nnodes and self.n_gpus_per_node <= 0:
            p.errors.append(f"{path}.n_gpus_per_node must be > 0 when {path}.nnodes > 0")
        p.notes += self._multi_turn_notes(path)
        return p.raise_errors()

    def _multi_turn_notes(self, path: str) -> list[str]:
        """Tools, interactions and agent loops configured so that they would act otherwise than asked."""
        mt, agent, notes = self.multi_turn, self.agent, []
        tools = mt.tool_config_path or mt.interaction_config_path
        single_turn = agent.default_agent_loop in (None, "single_turn_agent")
        if mt.enable and not (tools or not single_turn or agent.agent_loop_config_path):
            notes.append(
                f"{path}.multi_turn.enable=True with no tool_config_path, interaction_config_path or agent "
                "loop configured: samples whose agent_name is tool_agent run multi-turn without tools"
            )
        if tools and single_turn:
            notes.append(
                f"tools / interactions are configured and {path}.agent.default_agent_loop=single_turn_agent: "
                "only samples whose agent_name is tool_agent use them (veRL's sglang_multiturn data sets have "
                f"no agent_name column: set {path}.agent.default_agent_loop=tool_agent for them)"
            )
        if tools and not mt.enable:
            notes.append(
                f"{path}.multi_turn.enable=False but tools / interactions are configured: they are used by "
                "samples whose agent_name is tool_agent (as in veRL 0.9.1, the sample's agent_name decides)"
            )
        return notes


# veRL's yaml keys at actor_rollout_ref.rollout that hybridflow's yaml sets otherwise than the dataclass
_YAML_VALUES = {
    "name": "hf",
    "n_gpus_per_node": 1,
    "dtype": "auto",
    "tensor_model_parallel_size": 1,
    "max_num_seqs": 256,
    "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": None}, "sglang": {}, "trtllm": {}},
    "calculate_log_probs": True,
}
# keys veRL's dataclass has and its yaml does not hold at actor_rollout_ref.rollout
NOT_IN_YAML = tuple(
    "limit_images repetition_penalty standalone_gpu_memory_utilization moe_tensor_parallel_size server custom "
    "checkpoint_manager_class layer_name_map sglang_engine_mode enable_sleep_mode agent.agent_loop_manager_class "
    "disaggregation.mooncake_protocol".split()
)


def rollout_as_in_yaml(**values: Any) -> RolloutConfig:
    """The rollout section as hybridflow's ppo_trainer.yaml holds it (the hf engine, sized for one device,
    the profiler and qat sections configured); ``values`` override. A partial rollout section read at a door
    (a plain dict in the engines' and agent loop's tests) starts from here, not from veRL's dataclass defaults."""
    base = {**_YAML_VALUES, "engine_kwargs": copy.deepcopy(_YAML_VALUES["engine_kwargs"])}
    return RolloutConfig(**{**base, "profiler": ProfilerConfig(), "qat": QATEngineConfig(), **values})
