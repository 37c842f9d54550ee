#!/usr/bin/env bash
# Create .venv with the pinned CPU stack (torch 2.13.0 CPU build, ray, transformers, ...) and
# install hybridflow into it. Idempotent: a second run only re-installs hybridflow itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, ray, transformers, tensordict, hydra, pyarrow, pytest, hypothesis" 2>/dev/null; then
  .venv/bin/python -m pip install -q -r requirements-cpu.txt
fi
.venv/bin/python -m pip install -q --no-deps -e .
.venv/bin/python -c "import hybridflow, torch; print('hybridflow', hybridflow.__version__, '| torch', torch.__version__)"
