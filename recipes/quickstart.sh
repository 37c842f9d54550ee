#!/usr/bin/env bash
# hybridflow quickstart: does RL improve a model? One command on a CPU machine (~16 minutes on 2 cores since the async rollout server; 10 before, PPO ~14).
#
#   bash recipes/quickstart.sh [--seed 0] [--workdir quickstart_out] [--quick] [--algo grpo|ppo]
#
# Sets up the environment if needed (a .venv with the pinned CPU stack and hybridflow installed in
# editable mode; skipped when already there), then runs recipes/quickstart.py: tiny model + GSM8K-format
# arithmetic task -> SFT warm-up (checkpoint chosen by accuracy) -> greedy eval -> GRPO with
# `python -m hybridflow.main_ppo` -> eval again. Prints accuracy before/after and writes
# <workdir>/quickstart_result.json and <workdir>/quickstart_curves.png.
# Environment: PYTHON (interpreter that creates the venv, default python3), HYBRIDFLOW_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
SETUP_START=$SECONDS
source recipes/_ensure_venv.sh

export QUICKSTART_SETUP_SECONDS=$((SECONDS - SETUP_START))
exec "$VENV/bin/python" recipes/quickstart.py "$@"
