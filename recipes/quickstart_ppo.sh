#!/usr/bin/env bash
# The quickstart with PPO instead of GRPO: gae advantages from a critic (a value head on the SFT model),
# one response per prompt and 128 prompts per step (GRPO's sample budget: 16 prompts x 8 responses).
#
#   bash recipes/quickstart_ppo.sh [--seed 0] [--workdir quickstart_ppo_out] [--critic_lr 5e-4] [--critic_warmup 2]
set -euo pipefail
exec bash "$(dirname "$0")/quickstart.sh" --algo ppo --workdir quickstart_ppo_out "$@"
