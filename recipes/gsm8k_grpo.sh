#!/usr/bin/env bash
# GRPO on GSM8K with a real model on GPUs (veRL's examples/grpo_trainer command line, hybridflow module).
#
#   bash recipes/gsm8k_grpo.sh [extra key=val overrides ...]
#
# Needs: a local copy of openai/gsm8k (RAW_GSM8K) and of the model (MODEL_PATH); nothing is downloaded.
# Defaults fit one node of 8 GPUs with Qwen2.5-3B-Instruct; for 1 GPU set N_GPUS=1 (and maybe smaller
# batches). Rollout engine: vllm (pip install -e .[vllm]); ROLLOUT=hf runs without vLLM, slower.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RAW_GSM8K=${RAW_GSM8K:-$HOME/raw/gsm8k}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen2.5-3B-Instruct}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
ROLLOUT=${ROLLOUT:-vllm}

if [ ! -f "$DATA_DIR/train.parquet" ]; then
  "$PYTHON" -m hybridflow.data.preprocess.gsm8k --local_dir "$RAW_GSM8K" --local_save_dir "$DATA_DIR"
fi

"$PYTHON" -m hybridflow.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  data.train_batch_size=1024 \
  data.max_prompt_length=512 \
  data.max_response_length=1024 \
  data.filter_overlong_prompts=True \
  data.truncation=error \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.use_remove_padding=True \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=256 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.actor.kl_loss_type=low_var_kl \
  actor_rollout_ref.actor.entropy_coeff=0 \
  actor_rollout_ref.actor.fsdp_config.param_offload=False \
  actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
  actor_rollout_ref.rollout.name="$ROLLOUT" \
  actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
  actor_rollout_ref.ref.fsdp_config.param_offload=True \
  algorithm.use_kl_in_reward=False \
  trainer.critic_warmup=0 \
  trainer.logger="['console','file']" \
  trainer.project_name=hybridflow_grpo_gsm8k \
  trainer.experiment_name="$(basename "$MODEL_PATH")_grpo" \
  trainer.n_gpus_per_node="$N_GPUS" \
  trainer.nnodes="$NNODES" \
  trainer.save_freq=20 \
  trainer.test_freq=5 \
  trainer.total_epochs=15 \
  "$@"
