"""Write the leaf keys and defaults of a veRL config tree as reference data.

    python -m devtools.extract_verl_keys VERL_CONFIG_DIR CONFIG_NAME OUT_FILE --label "veRL 0.9.1"

VERL_CONFIG_DIR is veRL's ``verl/trainer/config`` directory (of an installed wheel or a checkout);
CONFIG_NAME the yaml to compose (``ppo_trainer``, ``evaluation``, ``sft_trainer_engine``, ...). The
config is composed with Hydra exactly as veRL's entry point would (defaults list included) and
every leaf is written as one JSON object per line: ``{"key": dotted path, "default": resolved
value, "raw": the unresolved text when it differs}``. An empty mapping is a leaf (veRL's free-form
dicts such as ``override_config``). Tests cannot read veRL's files, so this output is committed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hybridflow.utils.nested_dict import leaf_items

__all__ = ["extract", "read_key_file"]


def extract(config_dir: str | Path, name: str) -> list[dict]:
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        cfg = compose(config_name=name)
    raw = OmegaConf.to_container(cfg, resolve=False)
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    resolved_leaves = dict(leaf_items(resolved))
    rows = []
    for key, value in leaf_items(raw):
        row = {"key": key, "default": resolved_leaves.get(key, value)}
        if row["default"] != value:
            row["raw"] = value
        rows.append(row)
    return rows


def read_key_file(path: str | Path) -> dict[str, dict]:
    """``{key: row}`` from a file written by this tool (lines starting with # are comments)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            row = json.loads(line)
            out[row["key"]] = row
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_dir")
    parser.add_argument("config_name")
    parser.add_argument("out_file")
    parser.add_argument("--label", required=True, help="where the tree comes from, e.g. 'veRL 0.9.1 wheel'")
    args = parser.parse_args(argv)
    rows = extract(args.config_dir, args.config_name)
    header = (
        f"# {args.label}: config {args.config_name!r}, composed with Hydra; {len(rows)} leaf keys.\n"
        f"# Written by python -m devtools.extract_verl_keys; one JSON object per line.\n"
    )
    Path(args.out_file).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_file).write_text(header + "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    print(f"{args.out_file}: {len(rows)} keys")


if __name__ == "__main__":
    main()
