"""``gpu_check.py --profile``: where one ``update_actor`` spends its time, from the benchmark side only.

Three measurements after one warm-up update, each on its own update of the same batch:

- plain: the update timed alone (tokens/s, MFU), as gpu_check.py's normal run times it;
- phases: the same update with timers wrapped around its parts by monkeypatching (no library edit):
  the actor's ``_forward_micro_batch`` (model forward plus the log-prob over the vocabulary) and
  ``_micro_batch_loss``, ``torch.Tensor.backward``, ``clip_grad_and_step`` as the update loop calls it
  (gradient clipping, the optimizer step, zero_grad), forward hooks on the model and on its lm_head, and
  full backward hooks on the lm_head (they split the backward into the vocabulary tail, the lm_head and
  the model body). On a GPU the spans are CUDA events on the compute stream, so they measure the GPU's
  timeline, idle gaps included; "other" is the update's span minus the phases (dispatch, micro-batch
  split, host copies, metrics, waits);
- profiler: an update of one micro-batch's rows (the profiler's post-processing takes time per event;
  each micro-batch of the full update does the same work) under ``torch.profiler`` (CUDA activities;
  CPU on a CPU) with shapes recorded,
  started in the in-process group's thread, where the worker's method runs:
  the top ops by self device time, the top kernels, the GPU's busy time against the wall time, and the
  device time of every op with a vocabulary-sized dimension in its inputs (lm_head forward and
  backward matmuls, log-softmax, gather, casts).

Then the update again with other micro-batch sizes, with gradient checkpointing switched on, with
micro-batches packed up to a token budget (``use_dynamic_bsz``, as veRL's tuning guide advises), and with
FSDP2's gathered parameters kept from forward to backward, with torch.compile of the vocabulary's log-prob
or of the layers' parts (FSDP2's levers only where the actor runs on a mesh: not on one GPU since
2026-11-29, ``ComputeWeights``), and with all of these at once (``ppo_micro_batch_size_per_gpu`` is a mutable config
field; ``use_dynamic_bsz`` a frozen one, read by the update loop alone, which gets a copy with it set, and the
budget; checkpointing through the model's own switch; FSDP2's own setter; compile by monkeypatching), each
after its own warm-up, with tokens/s and peak memory, so one run says which lever moves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

# the phases of the breakdown, in the order they are printed; (name, parent or None)
PHASES = (
    ("forward", None),
    ("forward: model body", "forward"),
    ("forward: lm_head", "forward"),
    ("forward: log-prob over vocab", "forward"),
    ("policy loss", None),
    ("backward", None),
    ("backward: loss + log-prob over vocab", "backward"),
    ("backward: lm_head", "backward"),
    ("backward: model body", "backward"),
    ("optimizer (clip + step + zero_grad)", None),
    ("other (dispatch, split, copies, metrics)", None),
)
VOCAB_PHASES = (
    "forward: lm_head",
    "forward: log-prob over vocab",
    "backward: loss + log-prob over vocab",
    "backward: lm_head",
)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class PhaseClock:
    """Named spans on the device's timeline (CUDA events on the current stream; ``perf_counter`` on a
    CPU), opened and closed from wrappers or hooks, summed by name once the device is idle."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.spans: list[tuple[str, object, object]] = []
        self.open: dict[str, list] = {}

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def begin(self, name: str) -> None:
        self.open.setdefault(name, []).append(self._mark())

    def end(self, name: str) -> None:
        if self.open.get(name):
            self.spans.append((name, self.open[name].pop(), self._mark()))

    def switch(self, old: str, new: str) -> None:
        """Close ``old`` if it is open and open ``new`` (consecutive parts of one phase)."""
        self.end(old)
        self.begin(new)

    @contextlib.contextmanager
    def span(self, name: str):
        with torch.profiler.record_function(name):
            self.begin(name)
            try:
                yield
            finally:
                self.end(name)

    def totals(self) -> dict[str, float]:
        """Seconds per name; call after the device has finished the spans' work."""
        out: dict[str, float] = {}
        for name, start, stop in self.spans:
            seconds = start.elapsed_time(stop) / 1e3 if self.cuda else stop - start
            out[name] = out.get(name, 0.0) + seconds
        return out


@contextlib.contextmanager
def instrumented(worker, clock: PhaseClock, split_backward: bool = True):
    """Timers around the actor update's phases while the block runs; yields the list that collects
    each model forward's ``input_ids`` shape (the micro-batches as the model sees them).
    ``split_backward``: full backward hooks on the lm_head mark where its backward starts and ends."""
    import hybridflow.workers.utils.update_loop as update_loop

    actor, module = worker.actor, worker.actor_engine.module
    head = module.get_output_embeddings()
    shapes: list[tuple[int, ...]] = []
    undo = []

    def timed(fn, name):
        def wrapper(*args, **kwargs):
            with clock.span(name):
                return fn(*args, **kwargs)

        return wrapper

    for attr, name in (("_forward_micro_batch", "forward"), ("_micro_batch_loss", "micro-batch loss")):
        setattr(actor, attr, timed(getattr(actor, attr), name))  # an instance attribute shadows the method
        undo.append(lambda attr=attr: vars(actor).pop(attr))
    step = update_loop.clip_grad_and_step
    update_loop.clip_grad_and_step = timed(step, "optimizer (clip + step + zero_grad)")
    undo.append(lambda: setattr(update_loop, "clip_grad_and_step", step))

    backward = torch.Tensor.backward

    def timed_backward(tensor, *args, **kwargs):
        with clock.span("backward"):
            if split_backward:  # the lm_head's backward hooks close this part and open the next ones
                clock.begin("backward: loss + log-prob over vocab")
            try:
                return backward(tensor, *args, **kwargs)
            finally:  # whichever part is still open ends with the backward
                clock.end("backward: loss + log-prob over vocab")
                clock.end("backward: lm_head")
                clock.end("backward: model body")

    torch.Tensor.backward = timed_backward
    undo.append(lambda: setattr(torch.Tensor, "backward", backward))

    def model_pre(_module, _args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None:
            shapes.append(tuple(ids.shape))
        clock.begin("model")

    handles = [
        module.register_forward_pre_hook(model_pre, with_kwargs=True, prepend=True),
        module.register_forward_hook(lambda *_: clock.end("model")),
        head.register_forward_pre_hook(lambda *_: clock.begin("forward: lm_head")),
        head.register_forward_hook(lambda *_: clock.end("forward: lm_head")),
    ]
    if split_backward:
        handles += [
            head.register_full_backward_pre_hook(
                lambda *_: clock.switch("backward: loss + log-prob over vocab", "backward: lm_head")
            ),
            head.register_full_backward_hook(lambda *_: clock.switch("backward: lm_head", "backward: model body")),
        ]
    undo.extend(h.remove for h in handles)
    try:
        yield shapes
    finally:
        for fn in reversed(undo):
            fn()


def phase_breakdown(totals: dict[str, float], update_s: float) -> dict[str, float]:
    """Seconds per ``PHASES`` entry from the clock's raw spans (nested spans subtracted)."""
    get = totals.get
    out = {
        "forward": get("forward", 0.0),
        "forward: lm_head": get("forward: lm_head", 0.0),
        "forward: model body": get("model", 0.0) - get("forward: lm_head", 0.0),
        "forward: log-prob over vocab": get("forward", 0.0) - get("model", 0.0),
        "policy loss": get("micro-batch loss", 0.0) - get("forward", 0.0),
        "backward": get("backward", 0.0),
        "optimizer (clip + step + zero_grad)": get("optimizer (clip + step + zero_grad)", 0.0),
    }
    for part in ("backward: loss + log-prob over vocab", "backward: lm_head", "backward: model body"):
        out[part] = get(part, 0.0)
    top = ("forward", "policy loss", "backward", "optimizer (clip + step + zero_grad)")
    out["other (dispatch, split, copies, metrics)"] = update_s - sum(out[k] for k in top)
    return out


def _self_time(event, cuda: bool) -> float:
    """Self device time (CUDA) or self CPU time of a profiler average, microseconds."""
    if not cuda:
        return float(event.self_cpu_time_total)
    return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0))


def _dims(shapes) -> set[int]:
    out: set[int] = set()
    for s in shapes or ():
        if isinstance(s, (list, tuple)):
            out |= _dims(s)
        elif isinstance(s, int):
            out.add(s)
    return out


def profiler_tables(prof, cuda: bool, vocab: int, wall_s: float, top: int = 20) -> dict:
    """Top ops by self device time, top kernels, the device's busy time and the vocabulary ops' share
    from one ``torch.profiler`` run (user ranges are left out of every sum)."""
    from torch.autograd import DeviceType

    def user(e) -> bool:
        return bool(getattr(e, "is_user_annotation", False))

    events = [e for e in prof.key_averages() if not user(e)]
    ops = [e for e in events if e.device_type == DeviceType.CPU]
    kernels = [e for e in events if e.device_type != DeviceType.CPU]
    total_us = sum(_self_time(e, cuda) for e in (kernels if cuda else ops)) or 1.0

    def rows(items) -> list[dict]:
        items = sorted(items, key=lambda e: _self_time(e, cuda), reverse=True)[:top]
        return [
            dict(
                name=e.key, calls=int(e.count), self_ms=_self_time(e, cuda) / 1e3, share=_self_time(e, cuda) / total_us
            )
            for e in items
            if _self_time(e, cuda) > 0
        ]

    by_shape = [e for e in prof.key_averages(group_by_input_shape=True) if not user(e)]
    vocab_ops: dict[str, float] = {}
    for e in by_shape:
        if e.device_type == DeviceType.CPU and vocab in _dims(e.input_shapes):
            vocab_ops[e.key] = vocab_ops.get(e.key, 0.0) + _self_time(e, cuda)
    vocab_us = sum(vocab_ops.values())
    return {
        "top_ops": rows(ops),
        "top_kernels": rows(kernels) if cuda else [],
        "device_total_ms": total_us / 1e3,
        "profiled_wall_s": wall_s,
        "busy_share": total_us / 1e6 / wall_s,
        "vocab_ms": vocab_us / 1e3,
        "vocab_share": vocab_us / total_us,
        "vocab_ops": [
            dict(name=k, self_ms=v / 1e3, share=v / total_us)
            for k, v in sorted(vocab_ops.items(), key=lambda kv: kv[1], reverse=True)
        ],
    }


def timed_update(wg, data, device: str) -> tuple[float, int | None]:
    """(seconds, peak bytes allocated) of one ``update_actor`` call through the WorkerGroup."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    wg.update_actor(data)
    sync(device)
    seconds = time.perf_counter() - start
    return seconds, torch.cuda.max_memory_allocated() if device == "cuda" else None


def set_checkpointing(module, on: bool) -> bool:
    """Switch the (FSDP2-wrapped) transformers model's layer recompute; returns the state read back."""
    from hybridflow.workers.engine.fsdp import _enable_activation_checkpointing, is_activation_checkpointing

    if on:
        _enable_activation_checkpointing(module)
    else:
        off = getattr(module, "activation_checkpointing_disable", None) or module.gradient_checkpointing_disable
        off()
    return is_activation_checkpointing(module)


def compile_token_stats():
    """torch.compile of the log-prob/entropy over the vocabulary (what veRL's ``use_torch_compile`` compiles):
    ``logprob.token_stats`` is the function both forward paths call. Returns the undo."""
    from hybridflow.workers.utils import logprob

    eager = logprob.token_stats
    logprob.token_stats = torch.compile(eager, dynamic=True)

    def undo():
        logprob.token_stats = eager

    return undo


def compile_layer_parts(module):
    """torch.compile of each decoder layer's parts (attention, MLP, norms: their element-wise chains fuse);
    on an FSDP2 mesh inside its units (the layers), whose parameters are plain tensors while they run.
    Returns the undo."""
    parts = [
        child
        for layer in module.modules()
        if type(layer).__name__.endswith("DecoderLayer")
        for child in layer.children()
        if not isinstance(child, torch.nn.ModuleList)
    ]
    if not parts:
        raise RuntimeError("no *DecoderLayer module found to compile")
    for part in parts:
        part.compile(dynamic=True)

    def undo():
        for part in parts:
            part._compiled_call_impl = None  # what nn.Module.compile set

    return undo


def keep_unsharded_after_forward(module):
    """FSDP2 units keep their gathered (bf16) parameters from the forward to the backward instead of casting
    them again there: on one rank the saving is a cast per parameter per micro-batch, the cost one bf16 copy
    of the weights. Returns the undo, which reshards after the forward again (FSDP2's default and the engine's,
    which gpu_check does not change: ``fsdp_config.reshard_after_forward``)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not units:
        raise RuntimeError("the actor is not FSDP2-wrapped (on one rank only CPU offload runs on an FSDP2 mesh)")
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)

    def undo():
        for unit in units:
            unit.set_reshard_after_forward(True, recurse=False)

    return undo


COMPILE_LEVERS = {"token_stats": lambda module: compile_token_stats(), "layers": compile_layer_parts}


@contextlib.contextmanager
def variant_applied(worker, v: dict):
    """The worker set up as variant ``v`` says (micro-batch rows or a token budget, checkpointing, a compile
    lever) for the duration; put back as it was afterwards, also after a failure."""
    from hybridflow.workers.engine.fsdp import is_activation_checkpointing

    config, module, loop = worker.actor.config, worker.actor_engine.module, worker.actor.update_loop
    saved = (config.ppo_micro_batch_size_per_gpu, loop.config, loop.max_token_len)
    ckpt0 = is_activation_checkpointing(module)
    undos = []
    try:
        if v.get("tokens"):  # dynamic batch: micro-batches packed up to a token budget. use_dynamic_bsz is a
            # frozen field (veRL's), read by the update loop alone: the loop gets a copy with it set
            loop.config = dataclasses.replace(loop.config, use_dynamic_bsz=True)
            loop.max_token_len = int(v["tokens"])
        else:
            loop.config = dataclasses.replace(loop.config, use_dynamic_bsz=False)
            config.ppo_micro_batch_size_per_gpu = v["micro"]
        v["checkpointing_read_back"] = set_checkpointing(module, v.get("checkpointing", False))
        if v.get("keep_unsharded"):
            undos.append(keep_unsharded_after_forward(module))
        for lever in filter(None, v.get("compile", "").split("+")):  # "token_stats+layers": both
            undos.append(COMPILE_LEVERS[lever](module))
        yield
    finally:
        for undo in reversed(undos):
            undo()
        config.ppo_micro_batch_size_per_gpu, loop.config, loop.max_token_len = saved
        set_checkpointing(module, ckpt0)


def short_error(exc: BaseException) -> str:
    """One line for a table: the kind, the message's first line and its last (a worker's error carries the
    rank's traceback between them)."""
    kind = "out of memory" if isinstance(exc, torch.OutOfMemoryError) else type(exc).__name__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = " ... ".join(dict.fromkeys(lines[:1] + lines[-1:]))  # once when they are the same line
    return f"{kind}: {text[:240]}"


def run_variants(wg, worker, data, device: str, variants: list[dict], tokens: int) -> list[dict]:
    """Each variant after its own warm-up (a compile lever compiles there); the worker is put back as it was
    afterwards. A variant that fails (out of memory, a compile error) is reported as such."""
    out = []
    for v in variants:
        row = dict(v)
        try:
            with variant_applied(worker, row):
                start = time.perf_counter()
                timed_update(wg, data, device)  # warm-up at the new shapes
                row["warmup_s"] = time.perf_counter() - start
                seconds, peak = timed_update(wg, data, device)
            row.update(update_s=seconds, tokens_per_s=tokens / seconds, peak_allocated_bytes=peak)
        except Exception as exc:  # noqa: BLE001 - one failed lever must not lose the others
            row["error"] = short_error(exc)
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        print(f"variant {variant_name(v)}: " + (row.get("error") or f"{row['tokens_per_s']:.0f} tokens/s"), flush=True)
        out.append(row)
    return out


def variant_name(v: dict) -> str:
    batch = f"token budget {v['tokens']} (dynamic batch)" if v.get("tokens") else f"micro-batch {v['micro']}"
    name = f"{batch}, checkpointing {'on' if v.get('checkpointing') else 'off'}"
    name += ", unsharded forward to backward" if v.get("keep_unsharded") else ""
    return name + (f", compiled {v['compile']}" if v.get("compile") else "")


def lever_variants(w: dict, row_tokens: int, compile_levers: bool, sharded: bool) -> list[dict]:
    """The levers ``--profile`` tries: micro-batch sizes and checkpointing (the first H100 run's), token budgets
    of 16, 24 and 32 rows; at 16 rows FSDP2's parameters kept from forward to backward (when sharded), then
    torch.compile of the vocabulary's log-prob, of the layers' parts, and all levers at once at 24 rows
    (last: the slowest to warm up, and the likeliest to fail)."""
    micro = w["micro"]
    out = [dict(micro=m, checkpointing=c) for m, c in ((2 * micro, False), (max(1, micro // 2), False), (micro, True))]
    out += [dict(tokens=rows * row_tokens) for rows in (2 * micro, 3 * micro, 4 * micro)]
    if sharded:
        out.append(dict(tokens=2 * micro * row_tokens, keep_unsharded=True))
    if compile_levers:
        out += [dict(tokens=2 * micro * row_tokens, compile=c) for c in ("token_stats", "layers")]
        out.append(dict(tokens=3 * micro * row_tokens, keep_unsharded=sharded, compile="token_stats+layers"))
    return out


def phased_update(wg, worker, data, device: str, r: dict, split_backward: bool) -> None:
    """One update with the phase timers; fills ``r`` with the breakdown."""
    clock = PhaseClock(device)
    with instrumented(worker, clock, split_backward) as shapes:
        sync(device)
        with clock.span("update"):
            wg.update_actor(data)
        sync(device)
    totals = clock.totals()
    r["phase_update_s"] = totals["update"]
    r["phases_s"] = phase_breakdown(totals, totals["update"])
    r["backward_split"] = split_backward
    r["micro_batch_shapes"] = sorted(set(shapes))
    r["micro_batches"] = len(shapes)


def profiled_update(wg, worker, data, device: str, vocab: int, in_worker_thread: bool = True) -> dict:
    """One update under ``torch.profiler``; returns ``profiler_tables``. ``in_worker_thread``: the profiler
    starts in the thread where the in-process group runs the worker's method, because it records the CPU
    ops of the thread that starts it (the autograd threads inherit it); CUDA kernels are recorded from
    every thread either way."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities):  # kineto's first client must start in the main thread; warms it up
        torch.ones(8, device=device).sum().item()
    update, profiles = worker.update_actor, []

    def update_under_profiler(*args, **kwargs):
        with profile(activities=activities, record_shapes=True) as prof:
            out = update(*args, **kwargs)
            sync(device)
        profiles.append(prof)
        return out

    sync(device)
    start = time.perf_counter()
    if in_worker_thread:
        worker.update_actor = update_under_profiler  # an instance attribute: the group looks it up per call
        try:
            wg.update_actor(data)
        finally:
            del worker.update_actor
    else:
        with profile(activities=activities, record_shapes=True) as prof:
            wg.update_actor(data)
            sync(device)
        profiles.append(prof)
    wall = time.perf_counter() - start
    start = time.perf_counter()
    tables = profiler_tables(profiles[0], cuda, vocab, wall)
    tables["events"] = len(profiles[0].events())
    tables["tables_s"] = time.perf_counter() - start
    print(f"profiled update: {wall:.2f} s, {tables['events']} events, tables in {tables['tables_s']:.1f} s", flush=True)
    tables["in_worker_thread"] = in_worker_thread
    return tables


def profile_update_actor(
    wg, worker, data, w: dict, device: str, r: dict, report=print, compile_levers: bool = False
) -> dict:
    """The whole ``--profile`` measurement on a built worker, filling ``r`` as it goes (what was measured
    survives a later failure); ``report(r, section)`` is called when a section is complete. ``compile_levers``:
    try the torch.compile levers too (minutes of compiling on a CPU)."""
    from hybridflow.workers.engine.fsdp import is_activation_checkpointing

    tokens = int(data.batch["attention_mask"].sum())
    r.update(
        update_tokens=tokens,
        checkpointing=is_activation_checkpointing(worker.actor_engine.module),
        micro=w["micro"],
        vocab=worker.hf_config.vocab_size,
    )
    start = time.perf_counter()
    timed_update(wg, data, device)
    r["warmup_s"] = time.perf_counter() - start
    r["update_s"], r["peak_allocated_bytes"] = timed_update(wg, data, device)
    r["update_tokens_per_s"] = tokens / r["update_s"]
    print(
        f"warm-up update {r['warmup_s']:.2f} s; update {r['update_s']:.3f} s, {r['update_tokens_per_s']:.0f} tokens/s",
        flush=True,
    )

    try:
        phased_update(wg, worker, data, device, r, split_backward=True)
    except Exception as exc:  # noqa: BLE001 - the lm_head backward hooks are the fragile part: retry without
        r["phases_error"] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"phase timers with the lm_head backward hooks failed ({r['phases_error']}); again without", flush=True)
        phased_update(wg, worker, data, device, r, split_backward=False)
    report(r, "phases")

    # the profiler's Python post-processing costs about as much per event as the update's ops make events:
    # it sees one micro-batch's rows only (each micro-batch does the same work; plus one optimizer step)
    rows = w["micro"]
    part = data.slice(0, rows)
    try:
        r["profile"] = profiled_update(wg, worker, part, device, r["vocab"])
        if device == "cuda" and not r["profile"]["top_kernels"]:
            print("the profiler started in the worker's thread saw no CUDA kernel; again from the main thread")
            r["profile"] = profiled_update(wg, worker, part, device, r["vocab"], in_worker_thread=False)
        r["profile"]["rows"] = rows
        report(r, "profile")
    except Exception as exc:  # noqa: BLE001 - keep the breakdown and the levers
        r["profile_error"] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"torch.profiler failed: {r['profile_error']}", flush=True)

    row_tokens = w["prompt"] + w["response"]
    variants = lever_variants(w, row_tokens, compile_levers, sharded=bool(worker.actor_engine.sharded))
    r["variants"] = run_variants(wg, worker, data, device, variants, tokens)
    return r
