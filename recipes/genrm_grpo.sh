#!/usr/bin/env bash
# GRPO with a generative reward model (an LLM judge) on a CPU: the tiny model is the policy and, on a
# rollout engine of its own, the judge.
#
#   bash recipes/genrm_grpo.sh [--engine hf|vllm] [--workdir genrm_out] [--steps 4] [key=val overrides ...]
#
# Same environment setup as recipes/quickstart.sh, then recipes/genrm_grpo.py (its docstring says what
# the run shows). --engine vllm serves the judge with vLLM (CPU: bash recipes/setup_cpu.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/_ensure_venv.sh
exec "$VENV/bin/python" recipes/genrm_grpo.py "$@"
