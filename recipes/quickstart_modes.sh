#!/usr/bin/env bash
# The quickstart task trained in each async_training.mode: sync (colocated), one_step_off and fully_async
# (rollout on a worker of its own), and in veRL's V1 modes colocate_async (colocated, one warm-up batch
# ahead) and separate_async (rollout worker, two mini-batches a weight sync), all from the same SFT
# checkpoint, then one table of accuracy before/after and RL wall time per mode.
#
#   bash recipes/quickstart_modes.sh [--seed 0] [--workdir quickstart_modes_out] [--quick] [--modes "sync one_step_off fully_async colocate_async separate_async"]
#
# Sets up the environment like recipes/quickstart.sh. Full size on 2 cores: sync ~7 min with the SFT
# warm-up; the asynchronous modes took ~10 min each before the quickstart's speed-ups (not re-measured).
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=0; WORK=quickstart_modes_out; QUICK=(); MODES="sync one_step_off fully_async colocate_async separate_async"
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) SEED=$2; shift 2 ;;
    --workdir) WORK=$2; shift 2 ;;
    --quick) QUICK=(--quick); shift ;;
    --modes) MODES=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
VENV=${HYBRIDFLOW_VENV:-.venv}
SFT=()
for mode in $MODES; do
  # the first mode runs the SFT warm-up (recipes/quickstart.sh also sets up the venv); the others reuse its checkpoint
  bash recipes/quickstart.sh --seed "$SEED" --workdir "$WORK/$mode" --mode "$mode" "${QUICK[@]}" "${SFT[@]}"
  if [ ${#SFT[@]} -eq 0 ]; then
    SFT=(--sft_model "$("$VENV/bin/python" -c "import json,sys; print(json.load(open(sys.argv[1]))['sft_checkpoint'])" "$WORK/$mode/quickstart_result.json")")
  fi
done
"$VENV/bin/python" - "$WORK" $MODES <<'PY'
import json, os, sys
work, modes = sys.argv[1], sys.argv[2:]
print(f"\n{'mode':<14}{'before':>9}{'after':>9}{'points':>9}{'RL s':>8}{'steps':>7}")
for m in modes:
    r = json.load(open(os.path.join(work, m, "quickstart_result.json")))
    print(f"{m:<14}{r['accuracy_before']:>9.1%}{r['accuracy_after']:>9.1%}{(r['accuracy_after'] - r['accuracy_before']) * 100:>+9.1f}"
          f"{r['phase_seconds']['rl']:>8.0f}{r['steps']:>7}")
PY
