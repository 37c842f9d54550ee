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
source recipes/_ensure_venv.sh
exec "$VENV/bin/python" recipes/quickstart_tools.py "$@"
