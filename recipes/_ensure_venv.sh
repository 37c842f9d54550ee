# Sourced by the recipe scripts: make sure $VENV (default .venv) has the pinned CPU stack and hybridflow.
# Environment: PYTHON (interpreter that creates the venv, default python3), HYBRIDFLOW_VENV (default .venv).
# Sets VENV; the caller is at the repository root.
PY=${PYTHON:-python3}
VENV=${HYBRIDFLOW_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, transformers, ray, tensordict, pyarrow, hydra, omegaconf, pydantic" 2>/dev/null; then
  echo "[setup] installing the pinned CPU stack (requirements-cpu.txt; ~2.5 min, 1.7 GB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r requirements-cpu.txt
fi
if ! "$VENV/bin/python" -m pip show -q hybridflow >/dev/null 2>&1; then
  echo "[setup] installing hybridflow (editable, no dependencies)"
  "$VENV/bin/python" -m pip install -q --no-deps -e .
fi
