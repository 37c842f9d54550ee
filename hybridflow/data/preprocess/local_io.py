"""Reading a local copy of a hub data set and writing RL parquet files (shared by the scripts here).

A split is found as the hub serves it (``[subdir/]{split}-00000-of-00001.parquet``) or as
``{split}.parquet`` / ``{split}.jsonl`` / ``{split}.json``, directly in the directory or in one of
the config sub-directories (``main``, ``data``, ``default``).
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

SUBDIRS = ("", "main", "data", "default")


def find_split_files(local_dir: str, split: str, subdirs: Sequence[str] = SUBDIRS) -> list[str]:
    """The files that hold ``split``; the first directory and format that has any wins."""
    root = os.path.expanduser(local_dir)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"local data set directory not found: {root}")
    patterns = (f"{split}-*.parquet", f"{split}.parquet", f"{split}.jsonl", f"{split}.json")
    for sub in subdirs:
        for pattern in patterns:
            hits = sorted(glob.glob(os.path.join(root, sub, pattern)))
            if hits:
                return hits
    looked = ", ".join(os.path.join(sub, p) if sub else p for sub in subdirs for p in patterns[:3:2])
    raise FileNotFoundError(f"no {split!r} split in {root} (looked for e.g. {looked})")


def read_records(paths: Iterable[str]) -> list[dict]:
    """Rows of parquet, JSON-lines or JSON-array files, in order."""
    rows: list[dict] = []
    for path in paths:
        if path.endswith(".parquet"):
            rows += pq.read_table(path).to_pylist()
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path.endswith(".json") and text.lstrip().startswith("["):
            rows += json.loads(text)
        else:
            rows += [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows


def require_columns(rows: list[dict], columns: Sequence[str], source: str) -> None:
    if rows and any(c not in rows[0] for c in columns):
        raise KeyError(f"{source}: expected columns {list(columns)}, found {list(rows[0])}")


def convert_split(
    local_dir: str, split: str, process: Callable[[dict, int], dict], columns: Sequence[str]
) -> list[dict]:
    paths = find_split_files(local_dir, split)
    rows = read_records(paths)
    require_columns(rows, columns, ", ".join(paths))
    return [process(dict(r), i) for i, r in enumerate(rows)]


def write_rows(rows: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def preprocess_main(
    argv,
    description: str,
    dataset: str,
    default_save_dir: str,
    make_map_fn: Callable[[str], Callable[[dict, int], dict]],
    columns: Sequence[str],
) -> dict[str, str]:
    """The shared command line of the preprocessing scripts: a local copy in, train/test parquet out."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--local_dir",
        "--local_dataset_path",
        dest="local_dir",
        required=True,
        help=f"local copy of {dataset} (hub layout or train/test .jsonl)",
    )
    p.add_argument("--local_save_dir", default=default_save_dir, help="where train.parquet / test.parquet go")
    a = p.parse_args(argv)
    out_dir = os.path.expanduser(a.local_save_dir)
    written = {}
    for split in ("train", "test"):
        rows = convert_split(a.local_dir, split, make_map_fn(split), columns=columns)
        written[split] = os.path.join(out_dir, f"{split}.parquet")
        write_rows(rows, written[split])
        print(f"wrote {len(rows)} {split} rows to {written[split]}")
    return written
