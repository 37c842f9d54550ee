"""Rule groups shared by several configs: veRL repeats the same sub-trees (a Hugging Face model, an
FSDP engine, an optimizer, a profiler, a rollout engine) under different prefixes."""

from __future__ import annotations

import dataclasses

from hybridflow.config.refused import MEGATRON  # noqa: F401  (one text for the keys and the classes)
from hybridflow.config.support import KeyRule, honoured, not_supported, note

# reasons used in several places
PROFILER = "profiling is not implemented (the timing_s/* metrics time every phase)"
PROFILER_TOOLS = ("torch: torch.profiler traces; nsys needs NVIDIA Nsight Systems on CUDA and npu an Ascend NPU, "
                  "neither of which hybridflow drives; torch_memory and precision_debugger are not implemented")


def profiler(p: str):
    """A role's ``profiler`` section (veRL's ProfilerConfig) at ``p``: the torch tool's keys honoured."""
    return shared([rule for group in (
        honoured(f"{p}.enable", f"{p}.all_ranks", f"{p}.ranks", f"{p}.save_path", f"{p}.tool_config.torch.contents"),
        honoured(f"{p}.tool", values=(None, "torch"), reason=PROFILER_TOOLS),
        honoured(f"{p}.tool_config.torch.discrete", values=(False,),
                 reason="one trace per profiled step (discrete per-phase traces are not implemented)"),
        not_supported(f"{p}.tool_config.**", f"{p}.relocate_results", f"{p}.finish_hook_cmd",
                      f"{p}.finish_hook_all_ranks", f"{p}.finish_hook_ranks",
                      reason="only the torch tool is implemented; traces are written in save_path, no hooks run"),
        not_supported(f"{p}.tool_config.npu.**", reason=f"Ascend NPU profiler settings; {NPU}"),
    ) for rule in group])
def speed_only(what: str) -> str:
    return f"{what}: a speed/memory setting hybridflow does not apply (results are the same)"
VLM = "vision-language (multi-modal) models and data are not supported"
TARGET = "a veRL dataclass path; hybridflow validates the config into its own types"
NO_SP = "Ulysses sequence parallelism is implemented for the PPO actor, reference policy and critic only"
SP = ("Ulysses sequence parallelism: ranks form dp x sp groups, each group runs a slice of every packed sequence "
      "(needs model.use_remove_padding=True; the number of ranks and the attention heads must divide by it; token "
      "budgets are multiplied by it, as in veRL); the top-level key wins when > 1")
NPU = "hybridflow does not run on Ascend NPUs (CUDA GPUs and cpu only)"


def trainer_device():
    """``trainer.device``: what ``resolve_device`` accepts; an NPU is refused by name."""
    return honoured("trainer.device", values=("auto", "cpu", "cuda", "gpu"), reason=f"auto, cpu or cuda; {NPU}")


def shared(rules: list[KeyRule]) -> list[KeyRule]:
    """Rules of a sub-tree veRL repeats under several prefixes; not every copy has every key."""
    return [dataclasses.replace(rule, shared=True) for rule in rules]


def everything_under(prefix: str, reason: str):
    return not_supported(f"{prefix}.**", reason=reason)


def targets():
    return not_supported("**._target_", reason=TARGET)


def hf_model(p: str, *, tokenizer_path: bool = False, lora: bool = True, chat_template: bool = True):
    """veRL's hf_model.yaml at prefix ``p`` (the policy, the critic, the SFT model). ``chat_template``:
    the model's tokenizer formats conversations (the policy), so ``custom_chat_template`` is honoured."""
    groups = [
        honoured(f"{p}.path", f"{p}.trust_remote_code", f"{p}.external_lib", f"{p}.override_config.**",
                 f"{p}.enable_gradient_checkpointing", f"{p}.use_remove_padding"),
        honoured(f"{p}.enable_activation_offload", reason="CUDA only; on cpu activations already live in host memory"),
        not_supported(f"{p}.hf_config_path", reason="the model's config.json is read from model.path"),
        note(f"{p}.use_shm", reason="copying the model to shared memory only speeds up loading; hybridflow loads "
                                    "from the path"),
        note(f"{p}.use_liger", f"{p}.use_fused_kernels", f"{p}.fused_kernel_options.**", f"{p}.tiled_mlp.**",
             reason=speed_only("fused CUDA/Triton kernels, tiled MLP")),
        not_supported(f"{p}.mtp.**", reason="multi-token prediction (MTP) is not implemented"),
        not_supported(f"{p}.lora.**", reason=f"{MEGATRON}; LoRA is configured with model.lora_rank/lora_alpha/target_modules"),
    ]
    if chat_template:
        groups.append(honoured(f"{p}.custom_chat_template",
                               reason="replaces the tokenizer's chat template (prompts, multi-turn messages, saved "
                                      "checkpoints), as veRL does"))
    else:
        groups.append(not_supported(f"{p}.custom_chat_template",
                                    reason="this model never formats a conversation; the policy's template is "
                                           "actor_rollout_ref.model.custom_chat_template"))
    if tokenizer_path:
        groups.append(honoured(f"{p}.tokenizer_path"))
    else:
        groups.append(not_supported(f"{p}.tokenizer_path", reason="the tokenizer comes from data.tokenizer or the model path"))
    if lora:
        groups.append(honoured(f"{p}.lora_rank", f"{p}.lora_alpha", f"{p}.target_modules", f"{p}.exclude_modules",
                               reason="LoRA needs the [lora] extra (peft)"))
        groups.append(honoured(f"{p}.lora_adapter_path",
                               reason="a saved peft adapter to continue training (its own rank, alpha and targets)"))
    else:
        groups.append(not_supported(f"{p}.exclude_modules", f"{p}.lora_adapter_path",
                                    reason="LoRA is implemented for the policy only"))
        groups.append(honoured(f"{p}.lora_rank", values=(0,), reason="LoRA is implemented for the policy only"))
        groups.append(honoured(f"{p}.lora_alpha", f"{p}.target_modules", reason="used only when lora_rank > 0"))
    return shared([rule for group in groups for rule in group])


def fsdp_engine(p: str):
    """veRL's engine/fsdp.yaml (FSDPEngineConfig) at prefix ``p``, plus hybridflow's mixed_precision."""
    return shared([rule for group in (
        honoured(f"{p}.param_offload", f"{p}.optimizer_offload", f"{p}.offload_policy",
                 reason="CUDA only; on cpu parameters and optimizer state already live in host memory"),
        honoured(f"{p}.reshard_after_forward", f"{p}.mixed_precision.param_dtype", f"{p}.mixed_precision.reduce_dtype"),
        honoured(f"{p}.mixed_precision.buffer_dtype", values=("fp32", "float32"),
                 reason="buffers stay in fp32"),
        honoured(f"{p}.model_dtype", values=("fp32", "float32"), reason="weights are loaded in fp32 (mixed precision "
                                                                          "comes from mixed_precision.param_dtype)"),
        not_supported(f"{p}.dtype", reason="the compute dtype is fsdp_config.mixed_precision.param_dtype "
                                           "(auto: bf16 on CUDA, fp32 on cpu)"),
        honoured(f"{p}.fsdp_size", reason="hybrid sharding (HSDP): groups of fsdp_size ranks shard the "
                                          "parameters, the groups replicate one another; -1: one group"),
        honoured(f"{p}.ulysses_sequence_parallel_size", reason=SP),
        honoured(f"{p}.full_determinism", f"{p}.seed",
                 reason="deterministic kernels, cuBLAS/flash-attn/NCCL switches and seeded generators in the "
                        "worker process (seed: used only then); see README, Reproducibility"),
        not_supported(f"{p}.forward_only", f"{p}.strategy",
                      reason="set by veRL's worker; hybridflow's worker decides (strategy: the section's strategy key)"),
        note(f"{p}.wrap_policy.min_num_params", f"{p}.forward_prefetch", f"{p}.use_orig_params",
             f"{p}.use_torch_compile", f"{p}.entropy_from_logits_with_chunking", f"{p}.entropy_from_logits_chunk_size",
             f"{p}.entropy_checkpointing", f"{p}.use_no_sync_for_gradient_accumulation", f"{p}.pad_to_length",
             f"{p}.pad_to_length_bucket",
             reason=speed_only("FSDP wrapping/prefetch, torch.compile, chunked entropy, padding buckets")),
        not_supported(f"{p}.qat.**", reason="quantization-aware training is not implemented"),
        not_supported(f"{p}.turbo_config.**", reason="veRL's FSDP-turbo engine is not implemented"),
    ) for rule in group])


def optimizer(p: str):
    """veRL's optim/fsdp.yaml at prefix ``p``."""
    return shared([rule for group in (
        honoured(f"{p}.lr", f"{p}.lr_warmup_steps", f"{p}.lr_warmup_steps_ratio", f"{p}.total_training_steps",
                 f"{p}.weight_decay", f"{p}.betas", f"{p}.clip_grad", f"{p}.min_lr_ratio", f"{p}.num_cycles"),
        honoured(f"{p}.lr_scheduler_type", values=("constant", "cosine")),
        honoured(f"{p}.optimizer", values=("AdamW",), reason="hybridflow trains with torch.optim.AdamW"),
        honoured(f"{p}.optimizer_impl", values=("torch.optim",), reason="hybridflow trains with torch.optim.AdamW"),
        honoured(f"{p}.zero_indexed_step", values=(True,), reason="the schedule counts steps from 0"),
        not_supported(f"{p}.override_optimizer_config", reason="extra optimizer arguments are not implemented"),
    ) for rule in group])


def checkpoint(p: str):
    return shared([rule for group in (
        honoured(f"{p}.save_contents", f"{p}.load_contents"),
        not_supported(f"{p}.async_save", f"{p}.strict", reason="asynchronous / non-strict checkpoints are not implemented"),
    ) for rule in group])


VLLM_ENGINE = "read by the vllm rollout; the hf rollout ignores it (config checks print a note)"


JUDGE = ("the engine that serves a generative reward model (reward.reward_manager.name=genrm); a discriminative "
         "reward model (any other reward manager) is scored by hybridflow's FSDP worker, which does not read it "
         "(config checks print a note)")
JUDGE_VLLM = "read by the vllm judge engine (reward.reward_manager.name=genrm); the hf engine ignores it"


def reward_model_rollout(p: str):
    """veRL's reward.reward_model.rollout at prefix ``p``: the engine serving a generative reward model."""
    return [rule for group in (
        honoured(f"{p}.name", values=(None, "hf", "vllm"), reason=JUDGE + "; null: no engine (hybridflow's default, "
                 "veRL's ??? requires a value)"),
        honoured(f"{p}.temperature", f"{p}.top_k", f"{p}.top_p", f"{p}.do_sample", f"{p}.response_length",
                 f"{p}.prompt_length", f"{p}.ignore_eos", f"{p}.dtype", f"{p}.seed", f"{p}.max_num_seqs",
                 reason=JUDGE + "; a judge prompt longer than prompt_length is not sent (it scores "
                                "reward.reward_kwargs.unparsable_score and counts in genrm/prompt_too_long)"),
        honoured(f"{p}.n", values=(1,), reason="one verdict per response"),
        honoured(f"{p}.gpu_memory_utilization", f"{p}.enforce_eager", f"{p}.free_cache_engine", f"{p}.load_format",
                 f"{p}.tensor_model_parallel_size", f"{p}.max_num_batched_tokens", f"{p}.max_model_len",
                 f"{p}.enable_chunked_prefill", f"{p}.disable_log_stats", f"{p}.engine_kwargs", f"{p}.engine_kwargs.vllm.**",
                 reason=JUDGE_VLLM),
        honoured(f"{p}.skip_tokenizer_init", values=(False,),
                 reason="veRL requires the reward model's tokenizer; hybridflow's judge client tokenizes"),
        note(f"{p}.cudagraph_capture_sizes", f"{p}.enable_prefix_caching", f"{p}.layered_summon",
             f"{p}.multi_stage_wake_up", reason=speed_only("CUDA graphs, prefix caching, staged weight loading")),
        not_supported(f"{p}.data_parallel_size", f"{p}.expert_parallel_size", f"{p}.pipeline_model_parallel_size",
                      reason="only tensor parallelism is implemented inside a rollout engine"),
        not_supported(f"{p}.full_determinism", f"{p}.scheduling_policy",
                      reason="this rollout-engine feature is not implemented"),
        not_supported(f"{p}.limit_images", reason=VLM),
        not_supported(f"{p}.engine_kwargs.sglang.**", f"{p}.engine_kwargs.trtllm.**",
                      reason="sglang and TensorRT-LLM are not hybridflow rollout engines"),
        not_supported(f"{p}.quantization", f"{p}.quantization_config_file", f"{p}.mtp",
                      reason="quantized / speculative rollout is not implemented"),
        not_supported(f"{p}.disaggregation.**", reason="prefill/decode disaggregation is not implemented"),
    ) for rule in group]


def rollout(p: str, log_probs: bool = True, training: bool = True):
    """veRL's rollout/rollout.yaml at prefix ``p`` (the policy's rollout, main_generation's rollout).
    ``log_probs=False``: the entry point computes no log-probs, so the log_prob_* keys only print a note.
    ``training=False``: no training rollouts (main_generation), so over-sampling and tracing do not apply."""
    log_prob_keys = [f"{p}.log_prob_micro_batch_size", f"{p}.log_prob_micro_batch_size_per_gpu",
                     f"{p}.log_prob_use_dynamic_bsz", f"{p}.log_prob_max_token_len_per_gpu"]
    log_prob_rules = honoured(*log_prob_keys) if log_probs else note(*log_prob_keys, reason="no log-probs are computed here")
    if training:
        training_rules = [
            *honoured(f"{p}.over_sample_rate",
                      reason="training batches of the synchronous trainer: the first int(N*(1-rate)) trajectories to "
                             "finish are kept, the rest aborted and padded (empty response, response_mask 0), as "
                             "veRL's SGLang rollout did (veRL 0.9.1 declares the key but reads it nowhere)"),
            *honoured(f"{p}.trace.backend",
                      reason="null or mlflow (extra [trace]): one trace per trajectory in $MLFLOW_TRACKING_URI or "
                             "sqlite:///<trainer.default_local_dir>/mlflow.db; weave and trackio are not implemented"),
            *honoured(f"{p}.trace.project_name", f"{p}.trace.experiment_name", f"{p}.trace.token2text",
                      f"{p}.trace.max_samples_per_step_per_worker"),
        ]
    else:
        training_rules = [
            *note(f"{p}.over_sample_rate", reason="cuts training batches only; main_generation keeps every sample"),
            *not_supported(f"{p}.trace.**", reason="rollout tracing is implemented for main_ppo's rollouts"),
        ]
    return shared(log_prob_rules) + shared(training_rules) + shared([rule for group in (
        honoured(f"{p}.name", values=("hf", "vllm"),
                 reason="hybridflow's rollout engines are hf (transformers) and vllm; SGLang is not a hybridflow "
                        "rollout engine, nor TensorRT-LLM (veRL's sglang_multiturn examples run their multi-turn tool "
                        "and interaction rollouts on vllm or hf through the agent loop)"),
        honoured(f"{p}.mode", values=("async", "sync"),
                 reason="both run the asynchronous server + agent loop pipeline (veRL 0.9.1 removed sync)"),
        honoured(f"{p}.temperature", f"{p}.top_k", f"{p}.top_p", f"{p}.prompt_length", f"{p}.response_length",
                 f"{p}.dtype", f"{p}.do_sample", f"{p}.n", f"{p}.ignore_eos", f"{p}.val_kwargs.top_k",
                 f"{p}.val_kwargs.top_p", f"{p}.val_kwargs.temperature", f"{p}.val_kwargs.n", f"{p}.val_kwargs.do_sample"),
        honoured(f"{p}.gpu_memory_utilization", f"{p}.enforce_eager", f"{p}.free_cache_engine", f"{p}.load_format",
                 f"{p}.tensor_model_parallel_size", f"{p}.max_num_batched_tokens", f"{p}.max_model_len",
                 f"{p}.enable_chunked_prefill", f"{p}.disable_log_stats",
                 f"{p}.calculate_log_probs", f"{p}.engine_kwargs.vllm.**", reason=VLLM_ENGINE),
        honoured(f"{p}.seed", f"{p}.max_num_seqs",
                 reason="read by both rollouts (hf: the per-request sampling seed's base / the largest decode batch)"),
        note(f"{p}.cudagraph_capture_sizes", f"{p}.enable_prefix_caching", f"{p}.skip_tokenizer_init",
             f"{p}.layered_summon", f"{p}.multi_stage_wake_up",
             reason=speed_only("CUDA graphs, prefix caching, staged weight loading")),
        honoured(f"{p}.nnodes", f"{p}.n_gpus_per_node"),
        not_supported(f"{p}.data_parallel_size", f"{p}.expert_parallel_size", f"{p}.pipeline_model_parallel_size",
                      reason="only tensor parallelism is implemented inside a rollout engine"),
        honoured(f"{p}.logprobs_mode", values=("processed_logprobs",),
                 reason="the engines return log softmax(logits / temperature) of the sampled token"),
        not_supported(f"{p}.full_determinism", f"{p}.scheduling_policy", f"{p}.router_config_path", f"{p}.enable_rollout_routing_replay",
                      f"{p}.moe_load_balance_metrics_interval",
                      reason="this rollout-engine feature is not implemented"),
        not_supported(f"{p}.engine_kwargs.sglang.**", f"{p}.engine_kwargs.trtllm.**",
                      reason="sglang and TensorRT-LLM are not hybridflow rollout engines"),
        # veRL's SGLang server mode (RolloutConfig.server, the *_server multi-turn examples): not in the yaml
        not_supported(f"{p}.server.**", f"{p}.sglang_rollout_mode",
                      reason="an SGLang-only option (SGLang's HTTP server mode); SGLang is not a hybridflow rollout "
                             "engine (use rollout.name=vllm or hf)"),
        # multi-turn rollouts: the tool_agent loop (hybridflow/agent_loop), on the hf and vllm engines
        honoured(f"{p}.multi_turn.enable", f"{p}.multi_turn.max_assistant_turns", f"{p}.multi_turn.max_user_turns",
                 f"{p}.multi_turn.max_parallel_calls", f"{p}.multi_turn.max_tool_response_length",
                 f"{p}.multi_turn.tool_response_truncate_side", f"{p}.multi_turn.tool_config_path",
                 f"{p}.multi_turn.interaction_config_path", f"{p}.multi_turn.use_inference_chat_template",
                 f"{p}.multi_turn.tokenization_sanity_check_mode", f"{p}.multi_turn.tool_call_timeout"),
        honoured(f"{p}.multi_turn.format", reason="a registered tool-call parser (built in: hermes); the start-up "
                                                   "checks refuse other names"),
        not_supported(f"{p}.multi_turn.function_tool_path",
                      reason="veRL's @function_tool Python-function tools are not implemented; declare the tool as a "
                             "BaseTool class in multi_turn.tool_config_path"),
        note(f"{p}.multi_turn.num_repeat_rollouts", reason="veRL 0.9.1 declares it but does not read it either"),
        not_supported(f"{p}.multi_turn._target_", f"{p}.agent._target_", reason=TARGET),
        not_supported(f"{p}.multi_turn.**", reason="this multi-turn option of veRL's (SGLang rollout) is not "
                                                   "implemented"),
        honoured(f"{p}.agent.num_workers", f"{p}.agent.default_agent_loop", f"{p}.agent.agent_loop_config_path"),
        not_supported(f"{p}.agent.custom_async_server.**", f"{p}.agent.agent_loop_manager_class",
                      reason="custom async rollout servers / agent loop managers are not implemented (hybridflow's "
                             "server is the hf or vllm engine)"),
        not_supported(f"{p}.agent.**", reason="this agent loop option is not implemented"),
        honoured(f"{p}.checkpoint_engine.update_weights_bucket_megabytes"),
        honoured(f"{p}.checkpoint_engine.backend", values=("naive",),
                 reason="weights travel in buckets through the worker process (colocated) or Ray's object store "
                        "(a separate rollout pool); nccl/nixl/hccl checkpoint engines are not implemented"),
        not_supported(f"{p}.checkpoint_engine.**", reason="custom checkpoint engines are not implemented"),
        profiler(f"{p}.profiler"),
        not_supported(f"{p}.prometheus.**", reason="the Prometheus exporter is not implemented"),
        not_supported(f"{p}.quantization", f"{p}.quantization_config_file", f"{p}.qat", f"{p}.mtp",
                      reason="quantized / speculative rollout is not implemented"),
        not_supported(f"{p}.disaggregation.**", reason="prefill/decode disaggregation is not implemented"),
    ) for rule in group])
