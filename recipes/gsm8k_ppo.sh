#!/usr/bin/env bash
# PPO (gae + critic) on GSM8K with a real model on GPUs (veRL's examples/ppo_trainer command line).
#
#   bash recipes/gsm8k_ppo.sh [extra key=val overrides ...]
#
# Needs a local copy of openai/gsm8k (RAW_GSM8K) and of the model (MODEL_PATH; the critic starts from
# CRITIC_PATH, default the same model); nothing is downloaded. Defaults: one node of 8 GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RAW_GSM8K=${RAW_GSM8K:-$HOME/raw/gsm8k}
DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen2.5-0.5B-Instruct}
CRITIC_PATH=${CRITIC_PATH:-$MODEL_PATH}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
ROLLOUT=${ROLLOUT:-vllm}

if [ ! -f "$DATA_DIR/train.parquet" ]; then
  "$PYTHON" -m hybridflow.data.preprocess.gsm8k --local_dir "$RAW_GSM8K" --local_save_dir "$DATA_DIR"
fi

"$PYTHON" -m hybridflow.main_ppo \
  algorithm.adv_estimator=gae \
  data.train_files="$DATA_DIR/train.parquet" \
  data.val_files="$DATA_DIR/test.parquet" \
  data.train_batch_size=256 \
  data.max_prompt_length=512 \
  data.max_response_length=512 \
  data.filter_overlong_prompts=True \
  actor_rollout_ref.model.path="$MODEL_PATH" \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.rollout.name="$ROLLOUT" \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  critic.model.path="$CRITIC_PATH" \
  critic.model.enable_gradient_checkpointing=True \
  critic.optim.lr=1e-5 \
  critic.ppo_micro_batch_size_per_gpu=4 \
  algorithm.kl_ctrl.kl_coef=0.001 \
  trainer.critic_warmup=0 \
  trainer.logger="['console','file']" \
  trainer.project_name=hybridflow_ppo_gsm8k \
  trainer.experiment_name="$(basename "$MODEL_PATH")_ppo" \
  trainer.n_gpus_per_node="$N_GPUS" \
  trainer.nnodes="$NNODES" \
  trainer.save_freq=20 \
  trainer.test_freq=5 \
  trainer.total_epochs=15 \
  "$@"
