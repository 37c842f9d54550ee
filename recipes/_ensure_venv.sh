# Sourced by the recipe scripts: make sure $VENV (default .venv) has the pinned CPU stack and hybridflow.
# Environment: PYTHON (interpreter that creates the venv, default python3), HYBRIDFLOW_VENV (default .venv).
# Sets VENV; the caller is at the repository root.
#
# The check of an existing venv finds the packages without importing them (importlib.util.find_spec,
# importlib.metadata; ~0.1 s). Importing torch, transformers and ray to check them, plus `pip show`,
# took 8-15 s on 2 cores (up to ~1 min with a cold disk cache). A package that is present but broken
# fails at the recipe's first import instead, with its own traceback.
PY=${PYTHON:-python3}
VENV=${HYBRIDFLOW_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# exit status 0: all there; 4: hybridflow is not installed; anything else: (re)install the CPU stack.
# -I: neither the current directory nor PYTHONPATH count (a checkout's hybridflow/ is not an install)
_venv_state=0
"$VENV/bin/python" -I - <<'PY' || _venv_state=$?
import importlib.metadata, importlib.util, sys
stack = ("torch", "transformers", "ray", "tensordict", "pyarrow", "hydra", "omegaconf", "pydantic", "matplotlib")
if any(importlib.util.find_spec(name) is None for name in stack):
    sys.exit(3)
try:
    importlib.metadata.distribution("hybridflow")
except importlib.metadata.PackageNotFoundError:
    sys.exit(4)
PY
if [ "$_venv_state" != 0 ] && [ "$_venv_state" != 4 ]; then
  echo "[setup] installing the pinned CPU stack (requirements-cpu.txt; ~2.5 min, 1.7 GB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r requirements-cpu.txt
fi
if [ "$_venv_state" != 0 ] && ! "$VENV/bin/python" -I -c "import importlib.metadata as m; m.distribution('hybridflow')" 2>/dev/null; then
  echo "[setup] installing hybridflow (editable, no dependencies)"
  "$VENV/bin/python" -m pip install -q --no-deps -e .
fi
unset _venv_state
