# The gsm8k tool example on Megatron (a config extending ppo_megatron_trainer).
set -x

PROJECT_DIR="$(pwd)"
CONFIG_PATH="$PROJECT_DIR/examples/sglang_multiturn/config"

python3 -m verl.trainer.main_ppo \
    --config-path="$CONFIG_PATH" \
    --config-name='gsm8k_multiturn_megatron_grpo' \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=sglang \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$CONFIG_PATH/tool_config/gsm8k_tool_config.yaml" \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 $@
