"""``python -m hybridflow.plot <run dir or metrics.jsonl> [-o curves.png] [--title TEXT]``

Draws the training reward and validation accuracy curves (SFT: the losses) of a run from its JSONL
metrics log (``trainer.logger=[console,file]`` writes ``<trainer.default_local_dir>/metrics.jsonl``).
The PNG goes next to the log unless ``-o`` says otherwise. Needs matplotlib (``hybridflow[plot]``).
"""

from __future__ import annotations

import argparse
import os
import sys

from hybridflow.utils.plotting import curves_from_rows, draw_curves, read_metrics_jsonl


def main(argv=None) -> str:
    p = argparse.ArgumentParser(prog="python -m hybridflow.plot", description=__doc__.split("\n\n")[1])
    p.add_argument("log", help="a run directory (holding metrics.jsonl) or a metrics .jsonl file")
    p.add_argument("-o", "--output", default=None, help="PNG path (default: curves.png next to the log)")
    p.add_argument("--title", default="", help="figure title (default: the log's path)")
    args = p.parse_args(argv)
    try:
        rows = read_metrics_jsonl(args.log)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    curves = curves_from_rows(rows)
    if not curves:
        print(
            f"error: {args.log} has no training reward (critic/score/mean), validation "
            "(val-core/.../reward/mean@n) or loss metrics to draw",
            file=sys.stderr,
        )
        raise SystemExit(2)
    folder = args.log if os.path.isdir(args.log) else os.path.dirname(os.path.abspath(args.log))
    output = args.output or os.path.join(folder, "curves.png")
    try:
        draw_curves(output, curves, args.title or os.path.abspath(args.log))
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    summary = ", ".join(
        f"{label}: {len(pts)} points, last {pts[-1][1]:.3f} at step {pts[-1][0]}" for label, pts in curves.items()
    )
    print(f"wrote {output} ({summary})")
    return output


if __name__ == "__main__":
    main()
