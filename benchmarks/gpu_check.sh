#!/usr/bin/env bash
# The one-GPU check, for a machine that has torch and transformers but reaches no package index: installs
# the wheels carried in .whl/ (made by benchmarks/gpu_wheels.sh) into $SITE (/tmp/site), runs benchmarks/gpu_check.py
# (Qwen2.5-0.5B shapes through the in-process backend: MFU of the FSDP2 actor update with fixed micro-batches and
# with token-budget ones, hf rollout vs generate, peak memory), then `pytest -m gpu`. The benchmark gets at most
# 270 s, pytest the rest of 8 minutes. The table, the JSON and both logs go to $OUT (default /tmp/gpu_check_out).
#
#   bash benchmarks/gpu_wheels.sh    # where pip works; then, on the GPU machine, with .whl/ beside:
#   bash benchmarks/gpu_check.sh [gpu_check.py's arguments]    # PYTHON=... picks the interpreter (python3)
#   PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh --device cpu --quick   # the pipeline, here, on a CPU
#     (wheels for that Python: bash benchmarks/gpu_wheels.sh 3.11)
#   bash benchmarks/gpu_check.sh --profile    # where one update's time goes and which lever moves it (micro-batch,
#     checkpointing, token budget, torch.compile): gpu_profile.md/.json; no pytest; at most 7 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_check_out}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
start=$SECONDS
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
  || { echo "gpu_check: installing .whl/*.whl failed (run benchmarks/gpu_wheels.sh first)"; exit 1; }
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import sys, torch, transformers, tensordict, hybridflow
print('python', sys.version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__,
      '| tensordict', tensordict.__version__, '| hybridflow from', hybridflow.__file__)" || exit 1

limit=270  # the check; --profile runs alone and compiles two torch.compile levers: it gets 420 s
for arg in "$@"; do [ "$arg" = --profile ] && limit=420; done
timeout -k 10 "$limit" "$PY" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
bench=${PIPESTATUS[0]}
echo "gpu_check.py: exit $bench after $((SECONDS - start)) s"
for arg in "$@"; do  # the profile is a benchmark-only run: it skips the tests
  [ "$arg" = --profile ] && { cp "$OUT/gpu_check.log" "$OUT/gpu_profile.log"; exit "$bench"; }
done
left=$((460 - (SECONDS - start)))  # pytest gets what the benchmark left of the 8 minutes (it took 144 s on an H100)
timeout -k 10 "$left" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
tests=${PIPESTATUS[0]}
echo "gpu_check.sh: gpu_check.py exit $bench, pytest -m gpu exit $tests, $((SECONDS - start)) s in all"
[ "$bench" -eq 0 ] && [ "$tests" -eq 0 ]
