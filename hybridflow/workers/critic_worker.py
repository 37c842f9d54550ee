"""CriticWorker: the value model (a token-classification head with one label: a value per position)."""

from __future__ import annotations

import time

from hybridflow.config.convert import as_section
from hybridflow.config.critic import FSDPCriticConfig
from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import Dispatch, Worker, register
from hybridflow.single_controller.base.dispatch_fns import make_nd_compute_dataproto_dispatch_fn
from hybridflow.single_controller.base.worker import default_device_backend
from hybridflow.utils.determinism import apply_full_determinism
from hybridflow.workers.checkpoint import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.workers.critic import DataParallelPPOCritic
from hybridflow.workers.engine import TrainEngine, engine_spec, weights_dtype
from hybridflow.workers.engine.lora import lora_spec
from hybridflow.workers.model_loading import (
    config_dir,
    import_external_lib,
    load_model,
    load_tokenizer,
    local_model_path,
    tokenizer_dir,
)
from hybridflow.workers.profiler import WorkerProfiler, merge_profilers
from hybridflow.workers.utils.device import on_device
from hybridflow.workers.utils.ulysses import build_layout
from hybridflow.workers.utils.ulysses_attention import use_ulysses_attention


class CriticWorker(Worker):
    """``config`` is the typed ``critic`` section (FSDP settings in ``critic.fsdp``, veRL 0.9.1's place); veRL's
    DictConfig or a dict is read into ``FSDPCriticConfig`` here, the door."""

    role = "critic"

    def __init__(self, config):
        super().__init__()
        self.config = critic_config = as_section(config, FSDPCriticConfig, "critic")
        apply_full_determinism([critic_config.fsdp])  # before the process group and any CUDA handle
        self.init_process_group()
        self.device, _ = default_device_backend()
        # Ulysses sequence parallelism: dp x sp ranks; an SP group gets one data-parallel share
        self.layout = build_layout(critic_config.sp_size, "critic.ulysses_sequence_parallel_size")
        self._register_dispatch_collect_info("critic", dp_rank=self.layout.dp_rank, is_collect=self.layout.is_collect)
        self.dp_size = self.layout.dp_size
        self.critic_config = critic_config.per_rank(self.dp_size)  # veRL's normalisation: sizes on one rank
        plan = merge_profilers([self.config.profiler])
        self.profiler = WorkerProfiler(plan, self.rank, self.role)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        model_cfg = self.config.model
        import_external_lib(model_cfg.external_lib)
        path = local_model_path(model_cfg.path, "critic.model.path")
        trust = bool(model_cfg.trust_remote_code)
        self.tokenizer = load_tokenizer(
            tokenizer_dir(model_cfg.tokenizer_path, path, "critic.model.tokenizer_path"), trust
        )
        # no dropout on the value head (HF defaults to 0.1): values and updates must be deterministic
        override = {"classifier_dropout": 0.0, **model_cfg.override_config}
        module = load_model(
            path,
            "token_classification",
            weights_dtype(self.critic_config.fsdp),  # fsdp.model_dtype
            override_config=override,
            trust_remote_code=trust,
            num_labels=1,
            config_path=config_dir(model_cfg.hf_config_path, "critic.model.hf_config_path"),
        )
        self.hf_config = module.config
        if self.layout.sp is not None:
            use_ulysses_attention(module, self.layout.sp_size, "critic.ulysses_sequence_parallel_size")
        spec = engine_spec(
            self.critic_config.fsdp,
            self.critic_config.strategy,
            self.device,
            bool(model_cfg.enable_gradient_checkpointing),
            activation_offload=bool(model_cfg.enable_activation_offload),
            # LoRA: adapters on the body, the value head (a fresh layer) trained in full
            lora=lora_spec(model_cfg, "critic.model", task_type="TOKEN_CLS"),
        )
        self.engine = TrainEngine(module, spec)
        optim = self.config.optim
        self.engine.setup_optimizer(optim, max(1, int(optim.total_training_steps)))  # -1 until main_ppo fills it
        self.critic = DataParallelPPOCritic(
            self.critic_config,
            self.engine.module,
            self.engine.optimizer,
            self.engine.lr_scheduler,
            dp_group=self.layout.dp_group,
            sp=self.layout.sp,
            precision=self.engine.precision,
        )
        self.critic.update_loop.after_mini_batch = self.profiler.mini_batch_done  # a profiler schedule's steps

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def compute_values(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        with self.profiler.stage("compute_values"):
            values = self.critic.compute_values(on_device(data, self.device))
        return DataProto.from_dict(
            tensors={"values": values.cpu()},
            meta_info={"metrics": {"timing_s/worker_values": [time.perf_counter() - start]}},
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def update_critic(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        with self.profiler.stage("update_critic"):
            metrics = self.critic.update_critic(on_device(data, self.device))
        metrics["critic/lr"] = [self.engine.lr_scheduler.get_last_lr()[0]]
        self.engine.lr_scheduler.step()
        metrics["timing_s/worker_update_critic"] = [time.perf_counter() - start]
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep=None, extra_state=None):
        save_engine_checkpoint(
            self.engine, local_path, hf_config=self.hf_config, tokenizer=self.tokenizer, extra_state=extra_state
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False):
        return load_engine_checkpoint(self.engine, local_path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, profile_step: int) -> bool:
        return self.profiler.start(profile_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> list[str]:
        return self.profiler.stop()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def parameter_checksum(self) -> float:
        """Sum of |params| of the full critic weights (tests and sanity checks: did training move them?)."""
        sd = self.engine.full_state_dict()
        return float(sum(v.double().abs().sum() for v in sd.values()))
