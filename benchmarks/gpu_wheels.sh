#!/usr/bin/env bash
# Wheels for benchmarks/gpu_check.sh, saved in .whl/ at the repository root (ignored by git).
#
# Why: the GPU machines this project borrows reach no package index. Their image has Python 3.12, torch,
# transformers, numpy, pyyaml, packaging, cloudpickle, pyarrow, pandas and pytest, but not what hybridflow's
# in-process path imports besides: tensordict (DataProto) + pyvers, omegaconf + antlr4 runtime and hydra-core
# (the config tree), pydantic + its core, annotated-types, typing-inspection and a typing_extensions new enough
# for it. Ray and vLLM are not needed there (trainer.backend=inprocess, rollout hf). Versions: requirements-cpu.txt's
# pins, and what pip resolved for them there.
#
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]      # default 3.12, the image's
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-3.12}
DEST=.whl
PINS=(tensordict==0.15.3 pyvers==0.2.3 omegaconf==2.3.0 hydra-core==1.3.8 pydantic==2.14.3 pydantic-core==2.50.4
      annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0)
rm -rf "$DEST" && mkdir -p "$DEST"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${PINS[@]}"
# antlr4-python3-runtime 4.9.3 (omegaconf's pin) is published as source only: build its pure-Python wheel here
python3 -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
ls -1 "$DEST"
bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "$(ls "$DEST"/*.whl | wc -l) wheels, $((bytes / 1024)) KiB in $DEST (limit 60 MiB)"
[ "$bytes" -le $((60 * 1024 * 1024)) ]
