#!/usr/bin/env bash
# hybridflow quickstart: does RL improve a model? One command on a CPU (about 5 minutes on an idle
# 2-core machine; the run ends with a table of wall and CPU seconds per phase).
#
#   bash recipes/quickstart.sh [--seed 0] [--workdir quickstart_out] [--quick] [--algo grpo|ppo]
#
# Sets up the environment if needed (a .venv with the pinned CPU stack and hybridflow installed in
# editable mode; an existing one is checked in ~0.1 s), then runs recipes/quickstart.py: tiny model +
# GSM8K-format arithmetic task -> SFT warm-up (checkpoint chosen by accuracy) -> greedy eval -> GRPO with
# `python -m hybridflow.main_ppo` -> eval again. Prints accuracy before/after and writes
# <workdir>/quickstart_result.json and <workdir>/quickstart_curves.png.
# Environment: PYTHON (interpreter that creates the venv, default python3), HYBRIDFLOW_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_START=${EPOCHREALTIME:-$SECONDS}  # bash >= 5: microseconds; older bash: whole seconds
source recipes/_ensure_venv.sh

export QUICKSTART_SETUP_SECONDS=$(awk -v a="$SETUP_START" -v b="${EPOCHREALTIME:-$SECONDS}" 'BEGIN { printf "%.2f", b - a }')
exec "$VENV/bin/python" recipes/quickstart.py "$@"
