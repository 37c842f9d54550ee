#!/usr/bin/env bash
# On-policy distillation on a CPU: the quickstart's SFT checkpoint (the student) learns from a GRPO-trained
# quickstart model (the teacher) served on an hf engine of its own; veRL's distillation.* keys.
#
#   bash recipes/distill.sh [--seed 0] [--workdir distill_out] [--student DIR] [--teacher DIR] [--quick]
#
# Same environment setup as recipes/quickstart.sh, then recipes/distill.py (its docstring lists the
# phases). Without --student/--teacher it runs the quickstart's SFT and GRPO first. Writes
# <workdir>/distill_result.json (accuracy_before / accuracy_after of the student, the KL curve).
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/_ensure_venv.sh
exec "$VENV/bin/python" recipes/distill.py "$@"
