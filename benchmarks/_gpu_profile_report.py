"""Markdown for ``gpu_check.py --profile`` (the numbers come from ``_gpu_profile.py``), one function per
section so that each can be printed as soon as it is measured."""

from __future__ import annotations

from _gpu_profile import PHASES, VOCAB_PHASES, variant_name

GIB = 2**30


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def _mfu(r: dict, tokens_per_s: float, factor: int) -> str:
    """factor x parameters x tokens/s over the matmul peak (6: forward + backward; 8: plus a recompute)."""
    return _pct(factor * r["params"] * tokens_per_s / r["matmul_flops"])


def header(r: dict) -> str:
    shapes = ", ".join(f"{b} x {s} = {b * s} tokens" for b, s in r.get("micro_batch_shapes", []))
    mfu = f"MFU (6·N·T) {_mfu(r, r['update_tokens_per_s'], 6)}"
    if r["checkpointing"]:
        mfu += f", counting the recompute (8·N·T) {_mfu(r, r['update_tokens_per_s'], 8)}"
    return "\n".join(
        [
            f"**{r['device']}**, torch {r['torch']}, transformers {r['transformers']}; Qwen2 {r['shape']} shapes, "
            f"{r['params'] / 1e6:.1f}M parameters, vocab {r['vocab']}; actor FSDP2 {r['sharded']}, "
            f"compute {r['compute_dtype']}; matmul peak {r['matmul_flops'] / 1e12:.1f} TFLOP/s",
            "",
            f"update: {r['update_tokens']} tokens in {r['update_s']:.3f} s = {r['update_tokens_per_s']:.0f} tokens/s, "
            f"{mfu}; gradient checkpointing **{'on' if r['checkpointing'] else 'off'}**; "
            f"micro-batch {r['micro']} rows: {r.get('micro_batches', '?')} model forwards per update of {shapes}; "
            f"peak allocated {_gib(r.get('peak_allocated_bytes'))}",
        ]
    )


def phases(r: dict) -> str:
    total = r["phase_update_s"]
    lines = [
        f"### Where the update's time goes (one update with phase timers: {total:.3f} s on the device's timeline)",
        "",
        "| phase | s | % of update |",
        "|---|---|---|",
    ]
    for name, parent in PHASES:
        if parent == "backward" and not r.get("backward_split"):
            continue
        s = r["phases_s"].get(name, 0.0)
        label = f"&nbsp;&nbsp;{name.split(': ', 1)[1]}" if parent else f"**{name}**"
        lines.append(f"| {label} | {s:.3f} | {_pct(s / total)} |")
    vocab = [k for k in VOCAB_PHASES if r.get("backward_split") or k.startswith("forward")]
    vocab_s = sum(r["phases_s"].get(k, 0.0) for k in vocab)
    what = "forward + backward" if r.get("backward_split") else "forward only"
    lines.append(f"| **vocabulary: lm_head + log-prob ({what})** | {vocab_s:.3f} | {_pct(vocab_s / total)} |")
    if r.get("phases_error"):
        lines += ["", f"(the lm_head backward hooks failed, so the backward is not split: {r['phases_error']})"]
    return "\n".join(lines)


def profile(r: dict) -> str:
    p = r["profile"]
    unit = "CUDA" if r["device_kind"] == "cuda" else "CPU"
    lines = [
        f"### torch.profiler, one update of the first {p['rows']} rows = one micro-batch + the optimizer step "
        f"({p['profiled_wall_s']:.3f} s wall under the profiler, {p['events']} events)",
        "",
        f"{unit} busy {p['device_total_ms']:.1f} ms = {_pct(p['busy_share'])} of the profiled wall time; ops with "
        f"a vocab-sized ({r['vocab']}) input dimension: {p['vocab_ms']:.1f} ms = {_pct(p['vocab_share'])} "
        f"of the {unit} time"
        + (
            ""
            if p.get("in_worker_thread", True)
            else " (profiler started in the main thread: CPU ops of the worker's thread missing)"
        ),
        "",
        f"| op (top {len(p['top_ops'])} by self {unit} time) | calls | self {unit} ms | % of total |",
        "|---|---|---|---|",
    ]
    lines += [f"| {e['name']} | {e['calls']} | {e['self_ms']:.2f} | {_pct(e['share'])} |" for e in p["top_ops"]]
    if p["top_kernels"]:
        lines += ["", "| kernel (top 10) | calls | self CUDA ms | % of total |", "|---|---|---|---|"]
        lines += [
            f"| {e['name'][:90]} | {e['calls']} | {e['self_ms']:.2f} | {_pct(e['share'])} |"
            for e in p["top_kernels"][:10]
        ]
    lines += ["", f"| op with a vocab-sized input | self {unit} ms | % of total |", "|---|---|---|"]
    lines += [f"| {e['name']} | {e['self_ms']:.2f} | {_pct(e['share'])} |" for e in p["vocab_ops"][:10]]
    return "\n".join(lines)


def levers(r: dict) -> str:
    base = r["update_tokens_per_s"]
    lines = [
        "### Levers (each after its own warm-up; same batch)",
        "",
        "| variant | s/update | tokens/s | vs baseline | MFU 6·N·T | MFU 8·N·T (recompute) | peak allocated |",
        "|---|---|---|---|---|---|---|",
        f"| baseline: micro-batch {r['micro']}, checkpointing {'on' if r['checkpointing'] else 'off'} | "
        f"{r['update_s']:.3f} | {base:.0f} | 1.00x | {_mfu(r, base, 6)} | "
        f"{_mfu(r, base, 8) if r['checkpointing'] else '-'} | {_gib(r.get('peak_allocated_bytes'))} |",
    ]
    for v in r.get("variants", []):
        if "error" in v:
            lines.append(f"| {variant_name(v)} | {v['error']} | | | | | |")
            continue
        t = v["tokens_per_s"]
        lines.append(
            f"| {variant_name(v)} | {v['update_s']:.3f} | {t:.0f} | {t / base:.2f}x | {_mfu(r, t, 6)} | "
            f"{_mfu(r, t, 8) if v['checkpointing_read_back'] else '-'} | {_gib(v.get('peak_allocated_bytes'))} |"
        )
    return "\n".join(lines)


def markdown(r: dict) -> str:
    """The whole report (after ``finish`` has set the matmul peak); sections that failed are left out."""
    parts = [header(r)]
    if "phases_s" in r:
        parts.append(phases(r))
    parts.append(profile(r) if "profile" in r else f"torch.profiler failed: {r.get('profile_error')}")
    parts.append(levers(r))
    return "\n\n".join(parts)


def print_section(r: dict, section: str) -> None:
    """Progress output: a section as soon as it is measured (the full report follows at the end)."""
    print("\n" + {"phases": phases, "profile": profile}[section](r) + "\n", flush=True)
