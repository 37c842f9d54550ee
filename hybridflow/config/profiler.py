"""Profiling sections: a role's ``profiler`` (veRL's ProfilerConfig: which ranks of the role write traces,
with which tool), its per-tool settings, and ``global_profiler`` (the run's tool, steps and defaults the
roles follow). hybridflow implements the torch tool; the others are refused when chosen."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.errors import ConfigError
from hybridflow.config.reasons import NPU, PROFILER_TOOLS, TARGET
from hybridflow.config.status import honoured, refused

__all__ = [
    "TORCH_CONTENTS",
    "TOOL_NAME_KEYS",
    "NsightToolConfig",
    "NPUToolConfig",
    "SCHEDULE_KEYS",
    "TorchProfilerScheduleConfig",
    "TorchProfilerToolConfig",
    "TorchMemoryToolConfig",
    "PrecisionDebuggerToolConfig",
    "ProfilerToolConfig",
    "ProfilerConfig",
    "GlobalNsightToolConfig",
    "GlobalTorchMemoryConfig",
    "GlobalToolConfig",
    "GlobalProfilerConfig",
    "TOKEN_RANGE_KEYS",
    "HOOK_KEYS",
]

_NO_HOOKS = "traces are written in save_path directly; no finish hook runs"
_TORCH = "only the torch tool is implemented; traces are written in save_path, no hooks run"

_G = "global_profiler"
_GT = "global_profiler.global_tool_config"
# keys of a role's profiler that only the tools hybridflow does not drive read
HOOK_KEYS = ("relocate_results", "finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks")


def _g(key: str) -> str:
    return f"${{{_G}.{key}}}"


@dataclass
class NsightToolConfig(BaseConfig):
    """``tool_config.nsys``: Nsight Systems (not implemented)."""

    _target_: str = doc("verl.utils.profiler.config.NsightToolConfig", "the class this section is read into")
    discrete: bool | None = doc(False, "one database per task (else one per step)")
    name: str = doc("nsight", "the tool's name (veRL's tag; fixed)")


@dataclass
class NPUToolConfig(NsightToolConfig):
    """``tool_config.npu``: the Ascend profiler (not implemented)."""

    _target_: str = doc("verl.utils.profiler.config.NPUToolConfig", "the class this section is read into")
    contents: list[str] = doc([], "what is collected: npu, cpu, memory, shapes, module, stack")
    level: str = doc("level0", "collection level: level_none, level0, level1, level2")
    analysis: bool = doc(True, "parse the data after collection")
    discrete: bool = doc(False, "one database per task (else one per step)")
    profile_token_start: int | None = doc(None, "rollout: collect from this response-token index")
    profile_token_end: int | None = doc(None, "rollout: stop at this response-token index (exclusive)")
    name: str = doc("npu", "the tool's name (veRL's tag; fixed)")


SCHEDULE_KEYS = ("skip_first", "wait", "warmup", "active", "repeat")


@dataclass
class TorchProfilerScheduleConfig(BaseConfig):
    """``tool_config.torch.schedule``: torch.profiler.schedule over the update's mini-batches."""

    _target_: str = doc("verl.utils.profiler.config.TorchProfilerScheduleConfig", "the class this section is read into")
    skip_first: int = doc(0, "mini-batches skipped at the start")
    wait: int = doc(0, "idle mini-batches per cycle")
    warmup: int = doc(0, "warm-up mini-batches per cycle")
    active: int = doc(0, "recorded mini-batches per cycle; 0: record the whole update")
    repeat: int = doc(0, "cycles; 0: until profiling stops (a continuous trace: 1)")

    def __post_init__(self):
        bad = [k for k in SCHEDULE_KEYS if not isinstance(getattr(self, k), int) or getattr(self, k) < 0]
        if bad:
            raise ConfigError(
                f"profiler.tool_config.torch.schedule: {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)} "
                "must be whole numbers >= 0"
            )


@dataclass
class TorchProfilerToolConfig(BaseConfig):
    """``tool_config.torch``: torch.profiler (hybridflow's tool)."""

    _target_: str = doc("verl.utils.profiler.config.TorchProfilerToolConfig", "the class this section is read into")
    contents: list[str] = doc([], "what is added to the trace: cuda, cpu, memory, shapes, stack ([]: everything)")
    discrete: bool = doc(False, "one trace per stage (else one per profiled span)")
    profile_token_start: int | None = doc(None, "rollout: collect from this response-token index")
    profile_token_end: int | None = doc(None, "rollout: stop at this response-token index (exclusive)")
    schedule: TorchProfilerScheduleConfig | None = section(TorchProfilerScheduleConfig, "the update loop's sampling")
    name: str = doc("torch", "the tool's name (veRL's tag; fixed)")

    def __post_init__(self):
        unknown = sorted(set(self.contents) - set(TORCH_CONTENTS))
        if unknown:
            raise ConfigError(
                f"profiler.tool_config.torch.contents: unknown entries {unknown}; choose from {list(TORCH_CONTENTS)}"
            )


@dataclass
class TorchMemoryToolConfig(BaseConfig):
    """``tool_config.torch_memory``: memory snapshots (not implemented)."""

    _target_: str = doc("verl.utils.profiler.config.TorchMemoryToolConfig", "the class this section is read into")
    trace_alloc_max_entries: int = doc(100000, "allocation entries recorded")
    stack_depth: int = doc(32, "stack depth recorded per allocation")
    memory_snapshot_num_steps: int = doc(1, "profiled steps kept before a snapshot is dumped")
    name: str = doc("torch_memory", "the tool's name (veRL's tag; fixed)")


@dataclass
class PrecisionDebuggerToolConfig(BaseConfig):
    """``tool_config.precision_debugger``: msprobe (not implemented)."""

    _target_: str = doc("verl.utils.profiler.config.PrecisionDebuggerToolConfig", "the class this section is read into")
    config_path: str | None = doc(None, "msprobe config json")
    steps: list[int] | None = doc(None, "deprecated and ignored (global_profiler.steps decides)")
    stages: list[str] | None = doc(None, "stages profiled: actor_update, actor_compute_log_prob, ...")
    strict: bool = doc(False, "fail on an unknown stage or a missing msprobe")
    name: str = doc("precision_debugger", "the tool's name (veRL's tag; fixed)")


# what torch.profiler can add to a trace (veRL's list; CPU activity is always recorded)
TORCH_CONTENTS = ("cuda", "cpu", "memory", "shapes", "stack")

# the rollout's tool settings have a token range, the training roles' do not
TOKEN_RANGE_KEYS = (
    "tool_config.npu.profile_token_start",
    "tool_config.npu.profile_token_end",
    "tool_config.torch.profile_token_start",
    "tool_config.torch.profile_token_end",
)
# veRL's tool classes carry a fixed ``name`` that its profiler.yaml writes (the SFT config has them) and its
# ppo_trainer tree leaves out
TOOL_NAME_KEYS = tuple(
    f"tool_config.{tool}.name" for tool in ("nsys", "npu", "torch", "torch_memory", "precision_debugger")
)


@dataclass
class ProfilerToolConfig(BaseConfig):
    """``<role>.profiler.tool_config``: per-tool settings (veRL reads it as a plain mapping)."""

    nsys: NsightToolConfig | None = section(NsightToolConfig, "Nsight Systems")
    npu: NPUToolConfig | None = section(NPUToolConfig, "Ascend profiler")
    torch: TorchProfilerToolConfig | None = section(TorchProfilerToolConfig, "torch.profiler")
    torch_memory: TorchMemoryToolConfig | None = section(TorchMemoryToolConfig, "memory snapshots")
    precision_debugger: PrecisionDebuggerToolConfig | None = section(PrecisionDebuggerToolConfig, "msprobe")


@dataclass
class ProfilerConfig(BaseConfig):
    """``<role>.profiler``: the role's profiling switch; steps and the tool come from global_profiler."""

    _target_: str = doc("verl.utils.profiler.ProfilerConfig", "the class this section is read into")
    tool: str | None = doc(
        None,
        "profiler tool: torch, or null for none",
        follows="${global_profiler.tool}",
        values=(None, "torch"),
        reason=PROFILER_TOOLS,
    )
    enable: bool = doc(False, "profile this role")
    all_ranks: bool = doc(False, "profile every rank of the role (else only those in ranks)")
    ranks: list[int] = doc([], "the ranks to profile when all_ranks is false")
    save_path: str | None = doc("outputs/profile", "directory of the traces", follows=f"${{{_G}.save_path}}")
    relocate_results: bool = doc(False, "move the traces after the run", follows=_g("relocate_results"), refused=_TORCH)
    finish_hook_cmd: str | None = doc(None, "run when profiling ends", follows=_g("finish_hook_cmd"), refused=_TORCH)
    finish_hook_all_ranks: bool = doc(False, "hook on every rank", follows=_g("finish_hook_all_ranks"), refused=_TORCH)
    finish_hook_ranks: list[int] = doc([], "ranks running the hook", follows=_g("finish_hook_ranks"), refused=_TORCH)
    tool_config: ProfilerToolConfig = section(
        ProfilerToolConfig,
        "per-tool settings",
        follows={
            "nsys.discrete": f"${{{_GT}.nsys.discrete}}",
            **{
                f"torch_memory.{k}": f"${{{_GT}.torch_memory.{k}}}"
                for k in ("trace_alloc_max_entries", "stack_depth", "memory_snapshot_num_steps")
            },
            **{
                f"precision_debugger.{k}": f"${{{_GT}.precision_debugger.{k}}}"
                for k in ("config_path", "stages", "strict")
            },
        },
        refused=_TORCH,
        keys={
            "npu": refused("Ascend NPU profiler settings; " + NPU),
            "torch.contents": honoured(),
            "torch.discrete": honoured("true: one trace per stage (generate, compute_log_prob, update_actor, ...)"),
            # patterns, not literal keys: the rollout's section has no schedule
            "torch.schedule.*": honoured(),
            "torch.schedule._target_*": refused(TARGET),
        },
    )


def _nsight_options(worker: bool) -> dict:
    options = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}
    if worker:
        options.update({"capture-range": "cudaProfilerApi", "capture-range-end": None, "kill": "none"})
    return options


@dataclass
class GlobalNsightToolConfig(NsightToolConfig):
    """``global_profiler.global_tool_config.nsys``: the roles' default, plus nsys's command-line options."""

    controller_nsight_options: dict = doc(_nsight_options(False), "nsys options of the driver")
    worker_nsight_options: dict = doc(_nsight_options(True), "nsys options of the workers")


@dataclass
class GlobalTorchMemoryConfig(BaseConfig):
    """``global_profiler.global_tool_config.torch_memory``: the roles' defaults plus the recorder's options."""

    trace_alloc_max_entries: int = doc(100000, "allocation entries recorded")
    stack_depth: int = doc(32, "stack depth recorded per allocation")
    memory_snapshot_num_steps: int = doc(1, "profiled steps kept before a snapshot is dumped")
    context: str = doc("all", "alloc | state | all: which events are recorded")
    stacks: str = doc("all", "python | cpp | all: which stacks are recorded")
    kw_args: dict = doc({}, "further arguments of the recorder")


@dataclass
class GlobalToolConfig(BaseConfig):
    """``global_profiler.global_tool_config``: tool settings every role follows."""

    nsys: GlobalNsightToolConfig = section(GlobalNsightToolConfig, "Nsight Systems", absent=("name",))
    torch_memory: GlobalTorchMemoryConfig = section(GlobalTorchMemoryConfig, "memory snapshots")
    precision_debugger: PrecisionDebuggerToolConfig = section(PrecisionDebuggerToolConfig, "msprobe", absent=("name",))


@dataclass
class GlobalProfilerConfig(BaseConfig):
    """``global_profiler``: the run's profiling tool and steps (veRL reads it as a ProfilerConfig)."""

    _target_: str = doc("verl.utils.profiler.ProfilerConfig", "the class this section is read into")
    tool: str | None = doc(
        None,
        "the tool: torch (hybridflow), nsys, npu, torch_memory, precision_debugger",
        values=(None, "torch"),
        reason=PROFILER_TOOLS,
    )
    steps: list[int] | None = doc(None, "the training steps profiled (null: none)")
    profile_continuous_steps: bool = doc(False, "consecutive profiled steps share one trace")
    save_path: str | None = doc("outputs/profile", "directory of the traces (every role follows it)")
    relocate_results: bool = doc(False, "move framework-placed traces into save_path", refused=_NO_HOOKS)
    finish_hook_cmd: str | None = doc(None, "a command run once after the last profiled step", refused=_NO_HOOKS)
    finish_hook_all_ranks: bool = doc(False, "run finish_hook_cmd on every rank", refused=_NO_HOOKS)
    finish_hook_ranks: list[int] = doc([], "ranks that run finish_hook_cmd", refused=_NO_HOOKS)
    global_tool_config: GlobalToolConfig = section(
        GlobalToolConfig,
        "tool settings every role follows",
        refused="settings of the nsys, torch_memory and precision_debugger tools, which hybridflow does not drive",
    )
