#!/usr/bin/env bash
# hybridflow tool-use quickstart: does multi-turn RL teach a tiny model to use a calculator? One command on a CPU.
#
#   bash recipes/quickstart_tools.sh [--seed 0] [--workdir quickstart_tools_out] [--quick] [--interaction]
#
# Same environment setup as recipes/quickstart.sh, then recipes/quickstart_tools.py: tiny model + 3-digit x
# 2-digit multiplication -> SFT on a few hundred multi-turn tool-call demonstrations -> greedy held-out eval
# through the tool agent -> GRPO with the calculator tool (python -m hybridflow.main_ppo, multi-turn
# tool_agent) -> eval again. Prints accuracy and the share of right tool use before/after and writes
# <workdir>/quickstart_tools_result.json and <workdir>/quickstart_tools_curves.png.
# --interaction: the second run, with veRL's gsm8k interaction (a hint after a wrong answer) on top.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${HYBRIDFLOW_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[quickstart_tools] creating $VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, transformers, ray, tensordict, pyarrow, hydra, omegaconf, pydantic" 2>/dev/null; then
  echo "[quickstart_tools] installing the pinned CPU stack (requirements-cpu.txt)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r requirements-cpu.txt
fi
if ! "$VENV/bin/python" -m pip show -q hybridflow >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install -q --no-deps -e .
fi
exec "$VENV/bin/python" recipes/quickstart_tools.py "$@"
