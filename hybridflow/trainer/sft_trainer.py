"""Supervised fine-tuning (veRL's SFT trainer; config keys of 0.9.1's sft_trainer_engine, the earlier
fsdp_sft_trainer spellings mapped onto them): parquet (prompt, response) pairs, loss on the
response tokens only, one process per device under torchrun, Hugging Face model directories out.

Normalisation. A global batch of ``data.train_batch_size`` rows is split into W equal rank slices and
each slice into micro-batches. Every micro-batch sums its token NLLs and divides by the number of
response tokens of the WHOLE global batch (all-reduced), so the micro-batch losses of all ranks sum to
the global token-mean loss. DDP/FSDP average gradients over ranks, so each rank back-propagates
``W *`` its share: the update is the full-batch update whatever the micro-batch size or W.

The global batch is the same set of rows whatever W (rank r takes the r-th contiguous slice of it),
so a torchrun run with 2 processes sees exactly the batches of a single-process run.

Checkpoints: rank 0 writes ``<default_local_dir>/global_step_N/`` (config, safetensors, tokenizer,
generation config), all ranks then the training state a resume reads into ``global_step_N/engine/``
(``checkpoint.save_contents``: model and optimizer through torch.distributed.checkpoint, the LR schedule,
RNG and step in ``extra``), and rank 0 last ``latest_checkpointed_iteration.txt`` holding N. The RL
trainer starts from that directory with ``actor_rollout_ref.model.path=.../global_step_N``; a rerun with
``trainer.resume_mode=auto`` (the default) continues from it: the same weights, AdamW moments, learning
rate and data position (the batches of an epoch follow from the seed and the epoch alone).

LoRA (``model.lora_rank > 0``, or ``model.lora_adapter_path`` to continue a saved adapter): only the
adapters train; ``global_step_N/`` then holds the merged weights (a plain model, as before) and
``global_step_N/lora_adapter/`` the adapter as peft saves it (for a later ``lora_adapter_path``).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections.abc import Iterator

import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from hybridflow.config import ConfigError
from hybridflow.config.convert import as_section
from hybridflow.config.sft_trainer import SFT_LR_SCHEDULERS, SFT_STRATEGIES, SFTDataConfig, SFTTrainerConfig
from hybridflow.data.multiturn_sft_dataset import MultiTurnSFTDataset
from hybridflow.data.rl_dataset import collate_fn
from hybridflow.data.row_limit import max_samples_kwargs
from hybridflow.data.sampler import epoch_order
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.trainer.config_checks import resolve_device
from hybridflow.utils.checkpoint_copy import copy_checkpoint
from hybridflow.utils.determinism import apply_full_determinism
from hybridflow.utils.import_utils import load_module_from_file
from hybridflow.utils.torch_dtypes import resolve_dtype
from hybridflow.utils.torch_functional import logprobs_from_logits
from hybridflow.utils.tracking import SUPPORTED as SUPPORTED_LOGGERS
from hybridflow.utils.tracking import Tracking
from hybridflow.workers.checkpoint import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.workers.engine.fsdp import EngineSpec, TrainEngine, wants_offload
from hybridflow.workers.engine.lora import lora_spec, write_adapter_weights
from hybridflow.workers.engine.optim import build_optimizer, lr_multiplier, resolve_warmup_steps
from hybridflow.workers.model_loading import (
    config_dir,
    import_external_lib,
    load_model,
    load_tokenizer,
    local_model_path,
    tokenizer_dir,
)
from hybridflow.workers.profiler import WorkerProfiler, merge_profilers
from hybridflow.workers.utils.logprob import forward_response_token_stats
from hybridflow.workers.utils.micro_batches import clip_grad_and_step, grad_sync, token_budget_partitions
from hybridflow.workers.utils.ulysses import build_layout
from hybridflow.workers.utils.ulysses_attention import use_ulysses_attention

logger = logging.getLogger(__name__)

__all__ = ["FSDPSFTTrainer", "sft_nll_sum", "sft_lr_multiplier", "rank_slice", "create_sft_dataset", "latest_hf_dir"]

LATEST_FILE = "latest_checkpointed_iteration.txt"
ENGINE_STATE_DIR = "engine"  # global_step_N/engine: the training state (weights, AdamW, schedule, RNG, step)
LORA_ADAPTER_DIR = "lora_adapter"  # global_step_N/lora_adapter: the LoRA adapter alone, as peft saves it
TRAINING_STATE = frozenset(("model", "optimizer", "extra"))
METRICS_FILE = "metrics.jsonl"
LR_SCHEDULERS = SFT_LR_SCHEDULERS
STRATEGIES = SFT_STRATEGIES
LOGGERS = SUPPORTED_LOGGERS  # the same backends as the RL trainer (hybridflow.utils.tracking)


# --------------------------------------------------------------------------- pure pieces


def sft_nll_sum(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Summed next-token NLL over the response targets (0-d).

    ``logits (B, T, V)`` at position t predict ``input_ids[:, t+1]``; ``loss_mask (B, T)`` is 1 on
    response tokens (the targets), so it is shifted with the labels.
    """
    logp = logprobs_from_logits(logits[:, :-1], input_ids[:, 1:])  # (B, T-1)
    return -(logp * loss_mask[:, 1:].to(logp.dtype)).sum()


def sft_lr_multiplier(
    step: int,
    warmup_steps: int,
    total_steps: int,
    style: str = "cosine",
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> float:
    """Linear warmup, then ``cosine`` decay to ``min_lr_ratio`` at ``total_steps``, ``constant``, or
    ``wsd`` (warmup-stable-decay: constant for 90% of the post-warmup steps, cosine to 0 over the last 10%)."""
    if style in ("cosine", "constant"):
        return lr_multiplier(step, warmup_steps, total_steps, style, min_lr_ratio, num_cycles)
    if style != "wsd":
        raise ValueError(f"optim.lr_scheduler_type must be one of {LR_SCHEDULERS}, got {style!r}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    stable_end = warmup_steps + int(0.9 * (total_steps - warmup_steps))
    if step < stable_end:
        return 1.0
    progress = min(1.0, (step - stable_end) / max(1, total_steps - stable_end))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def sft_compute_dtype(dtype: str | None, device: str) -> torch.dtype | None:
    """The autocast dtype of ``engine.dtype`` on ``device`` (None: plain fp32). ``auto`` is bf16 on CUDA and
    fp32 on cpu, where bf16 pays off only on CPUs with bf16 units (the config check's note says which)."""
    name = resolve_dtype(dtype, device)
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(name)


def rank_slice(n_rows: int, rank: int, world_size: int) -> slice:
    """Rows of a global batch of ``n_rows`` that ``rank`` trains on (contiguous, equal sizes)."""
    if n_rows % world_size:
        raise ValueError(f"a global batch of {n_rows} rows does not split over {world_size} ranks")
    per_rank = n_rows // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def latest_hf_dir(default_local_dir: str) -> str | None:
    """The newest ``global_step_N`` directory recorded in ``latest_checkpointed_iteration.txt``."""
    path = os.path.join(os.path.expanduser(default_local_dir), LATEST_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return os.path.join(os.path.dirname(path), f"global_step_{int(f.read().strip())}")


def _load_class(path: str, name: str):
    """Class ``name`` from the Python file ``path`` (``data.custom_cls``), loaded as every user file is."""
    try:
        module = load_module_from_file(str(path))
    except ImportError as err:
        raise ImportError(f"data.custom_cls.path={path!r}: {err}") from err
    if not hasattr(module, name):
        raise AttributeError(f"data.custom_cls.name={name!r} is not defined in {path}")
    return getattr(module, name)


def create_sft_dataset(
    files, data_config: SFTDataConfig, tokenizer, max_samples: int = -1, max_samples_key: str = "data.train_max_samples"
):
    """``data.custom_cls`` if configured (called as ``cls(files, tokenizer, data_config)``, plus
    ``max_samples=`` where the class takes it: the row limit ``max_samples_key`` set), else
    MultiTurnSFTDataset for conversations (``data.multiturn.enable``, or data with a ``data.messages_key``
    column and no ``data.prompt_key`` column, as veRL 0.9.1 reads them), else SFTDataset.

    Items must follow SFTDataset's convention: ``loss_mask`` is 1 on the response tokens themselves
    (the targets), not shifted one to the left as veRL's SFTDataset stores it."""
    custom = data_config.custom_cls
    if custom.path:
        cls = _load_class(custom.path, custom.name)
    elif data_config.multiturn.enable or _holds_conversations(files, data_config):
        cls = MultiTurnSFTDataset  # chat messages (+ tools): loss on the assistant turns only
    else:
        cls = SFTDataset
    return cls(files, tokenizer, data_config, **max_samples_kwargs(cls, max_samples, max_samples_key))


def _holds_conversations(files, data_config: SFTDataConfig) -> bool:
    """The first file has the messages column and not the single-turn prompt column."""
    first = files if isinstance(files, str) else (list(files) or [None])[0]
    if not first or not os.path.isfile(os.path.expanduser(str(first))):
        return False  # the dataset names the missing file
    columns = set(pq.read_schema(os.path.expanduser(str(first))).names)
    return data_config.messages_key in columns and data_config.prompt_key not in columns


# --------------------------------------------------------------------------- the trainer


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _tied_duplicates(module: torch.nn.Module) -> set[str]:
    """Names under which an already-seen parameter appears again (tied embeddings): a gathered full
    state dict holds separate copies of them, which would be saved as untied tensors."""
    seen, duplicates = set(), set()
    for name, param in module.named_parameters(remove_duplicate=False):
        (duplicates.add(name) if id(param) in seen else seen.add(id(param)))
    return duplicates


class FSDPSFTTrainer:
    """SFT over one model on this rank (FSDP2, DDP or a plain module), with veRL's constructor order.

    ``config``: the composed sft_trainer tree (a DictConfig or dict), read into ``SFTTrainerConfig``
    (``self.config``), or that typed config itself; it is checked once (``SFTTrainerConfig.validate``).
    ``tokenizer``/``train_dataset``/``val_dataset`` are built from the config when not given;
    ``device_mesh``/``ulysses_device_mesh`` are accepted for veRL compatibility and unused: the ranks form
    ``engine.ulysses_sequence_parallel_size``-sized sequence-parallel groups of consecutive ranks (veRL's
    layout), each group one data-parallel replica that splits every packed micro-batch along the sequence.
    """

    def __init__(
        self, config, device_mesh=None, ulysses_device_mesh=None, tokenizer=None, train_dataset=None, val_dataset=None
    ):
        self.config = cfg = as_section(config, SFTTrainerConfig)  # a composed tree, or typed already
        self.rank, self.world_size = _world()
        sp_key = "engine.ulysses_sequence_parallel_size"
        self.layout = build_layout(int(cfg.engine.ulysses_sequence_parallel_size), sp_key)  # a collective
        self.sp = self.layout.sp  # None without sequence parallelism
        for note in cfg.validate(self.world_size, LOGGERS):
            self._say(logging.WARNING, f"note: {note}")
        device = resolve_device(cfg.trainer.device)
        model_cfg, data = cfg.model, cfg.data
        import_external_lib(model_cfg.external_lib)
        path = local_model_path(model_cfg.path, "model.path")
        trust = bool(model_cfg.trust_remote_code)
        if tokenizer is None:
            tokenizer = load_tokenizer(tokenizer_dir(model_cfg.tokenizer_path, path, "model.tokenizer_path"), trust)
        self.tokenizer = tokenizer
        if model_cfg.custom_chat_template:
            self.tokenizer.chat_template = model_cfg.custom_chat_template
        if train_dataset is None:
            train_dataset = create_sft_dataset(
                data.train_files, data, self.tokenizer, data.train_max_samples, "data.train_max_samples"
            )
        if val_dataset is None and data.val_files:
            val_dataset = create_sft_dataset(
                data.val_files, data, self.tokenizer, data.val_max_samples, "data.val_max_samples"
            )
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        batch = data.train_batch_size
        if len(self.train_dataset) < batch:
            raise ConfigError(
                f"data.train_batch_size={batch} is larger than the {len(self.train_dataset)} training rows"
            )
        self.steps_per_epoch = len(self.train_dataset) // batch
        self.total_steps = int(cfg.trainer.total_training_steps or cfg.trainer.total_epochs * self.steps_per_epoch)

        torch.manual_seed(cfg.trainer.seed)
        apply_full_determinism([cfg.engine])  # veRL's engine: reseeded with engine.seed before the model is built
        dtype = getattr(torch, resolve_dtype(cfg.engine.model_dtype, device))
        module = load_model(
            path,
            "causal_lm",
            dtype=dtype,
            override_config=model_cfg.override_config,
            trust_remote_code=trust,
            config_path=config_dir(model_cfg.hf_config_path, "model.hf_config_path"),
        )
        if self.sp is not None:
            use_ulysses_attention(module, self.sp.size, sp_key)  # before any wrapping
        spec = EngineSpec(
            strategy=cfg.engine.strategy,
            device=device,
            gradient_checkpointing=bool(model_cfg.enable_gradient_checkpointing),
            lora=lora_spec(model_cfg, "model"),  # only the adapters train; the checkpoint folder is merged
            param_offload=wants_offload(cfg.engine) and device == "cuda",
            fsdp_size=int(cfg.engine.fsdp_size),
        )
        self.engine = TrainEngine(module, spec)
        self.module = self.engine.module
        optim = cfg.optim
        self.optimizer = build_optimizer(
            self.module.parameters(),
            lr=float(optim.lr),
            betas=tuple(optim.betas),
            weight_decay=float(optim.weight_decay),
            overrides=optim.override_optimizer_config,
        )
        warmup = resolve_warmup_steps(int(optim.lr_warmup_steps), float(optim.lr_warmup_steps_ratio), self.total_steps)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: sft_lr_multiplier(
                step,
                warmup,
                self.total_steps,
                optim.lr_scheduler_type,
                float(optim.min_lr_ratio or 0.0),
                float(optim.num_cycles),
            ),
        )
        self.engine.optimizer, self.engine.lr_scheduler = self.optimizer, self.lr_scheduler  # what a checkpoint holds
        self.device = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        self.compute_dtype = sft_compute_dtype(cfg.engine.dtype, device)
        self._log_file = None
        profiling = cfg.profiler.tool == "torch" and cfg.profiler.enable  # steps: trainer.profile_interval
        self.profiler = WorkerProfiler(merge_profilers([cfg.profiler if profiling else None]), self.rank, "sft")
        self.resumed_from = self._resume_dir()
        self.global_step = self._load_training_state(self.resumed_from) if self.resumed_from else 0
        n_params = sum(p.numel() for p in module.parameters())
        self._say(
            logging.INFO,
            f"SFT: {n_params:,} params, {len(self.train_dataset)} train rows, "
            f"{self.total_steps} steps of {batch} rows on {self.world_size} {device} process(es)",
        )

    # --- data ---------------------------------------------------------------------------------------
    def train_batches(self, epoch: int, start: int = 0) -> Iterator[dict]:
        """This rank's slice of every global batch of ``epoch`` from batch ``start`` on (order from (seed,
        epoch) only, so a resumed run takes up where the checkpoint was written)."""
        batch = self.config.data.train_batch_size
        order = epoch_order(len(self.train_dataset), self.config.trainer.seed, epoch)
        mine = rank_slice(batch, self.layout.dp_rank, self.layout.dp_size)  # an SP group shares its rows
        for b in range(start, self.steps_per_epoch):
            rows = order[b * batch : (b + 1) * batch][mine]
            yield collate_fn([self.train_dataset[i] for i in rows])

    def _val_batches(self) -> Iterator[dict]:
        # every data-parallel rank gets len // dp rows (the remainder is dropped) so all run the same forwards
        dp_rank, dp_size = self.layout.dp_rank, self.layout.dp_size
        per_rank = len(self.val_dataset) // dp_size
        rows = range(dp_rank * per_rank, (dp_rank + 1) * per_rank)
        mbs = self.config.data.micro_batch_rows
        for i in range(0, per_rank, mbs):
            yield collate_fn([self.val_dataset[j] for j in rows[i : i + mbs]])

    def _micro_batches(self, batch: dict, by_tokens: bool = False) -> list[dict]:
        """Micro-batches of ``micro_batch_size_per_gpu`` rows, or (``by_tokens``: data.use_dynamic_bsz) of at most
        ``max_token_len_per_gpu`` tokens with nearly equal totals, the same count on every rank (FSDP's
        collectives stay in step); each cut after its last attended column (right padding: the longest row;
        left padding: nothing is cut)."""
        data, n = self.config.data, batch["input_ids"].shape[0]
        if by_tokens:
            budget = int(data.max_token_len_per_gpu) * self.layout.sp_size
            world = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
            lengths = batch["attention_mask"].sum(-1).tolist()
            parts = [torch.tensor(part) for part in token_budget_partitions(lengths, budget, world)]
        else:  # consecutive rows: slices, so a micro-batch is a view of the batch
            mbs = data.micro_batch_rows
            parts = [slice(i, i + mbs) for i in range(0, n, mbs)]
        out = []
        for rows in parts:
            attended = batch["attention_mask"][rows].any(dim=0).nonzero()  # host tensor: no device sync
            length = int(attended[-1]) + 1 if len(attended) else 1
            out.append(
                {
                    k: batch[k][rows, :length].to(self.device)
                    for k in ("input_ids", "attention_mask", "position_ids", "loss_mask")
                }
            )
        return out

    # --- steps --------------------------------------------------------------------------------------
    def _nll_sum(self, mb: dict) -> torch.Tensor:
        dtype = self.compute_dtype
        ids, mask, positions = mb["input_ids"], mb["attention_mask"], mb["position_ids"]
        with torch.autocast(device_type=self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            if self.sp is not None:  # packed rows, this rank's slice of them; the scores are gathered over the group
                log_probs, _, _ = forward_response_token_stats(
                    self.module,
                    ids,
                    mask,
                    positions,
                    response_length=ids.size(1) - 1,
                    use_remove_padding=True,
                    sp=self.sp,
                )  # fmt: skip  (every position predicts the next token)
                return -(log_probs.float() * mb["loss_mask"][:, 1:].float()).sum()
            logits = self.module(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        return sft_nll_sum(logits.float() if logits.dtype != torch.float32 else logits, ids, mb["loss_mask"])

    def training_step(self, batch: dict) -> dict[str, float]:
        """One optimizer step on this rank's rows of a global batch; returns global metrics."""
        self.module.train()
        start = time.perf_counter()
        micro_batches = self._micro_batches(batch, by_tokens=self.config.data.use_dynamic_bsz)
        # response targets of the whole global batch (all ranks; the ranks of an SP group hold the same rows)
        sp_size, dp_size = self.layout.sp_size, self.layout.dp_size
        local_tokens = batch["loss_mask"][:, 1:].sum().to(self.device, torch.float32)
        tokens = (_all_reduce_sum(local_tokens) / sp_size).clamp(min=1.0)
        loss_sum = torch.zeros((), device=self.device)
        for i, mb in enumerate(micro_batches):
            with grad_sync(self.module, sync=i == len(micro_batches) - 1):
                nll = self._nll_sum(mb)
                # x dp: DDP/FSDP average over all dp x sp ranks, and the SP gather's backward already scales by sp
                (nll * (dp_size / tokens)).backward()
            loss_sum += nll.detach()
        clip = self.config.optim.clip_grad
        grad_norm, skipped = clip_grad_and_step(self.module, self.optimizer, float(clip) if clip else None)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        loss, grad_norm, skipped, n_tokens = torch.stack(
            [_all_reduce_sum(loss_sum) / sp_size / tokens, grad_norm.to(self.device), skipped.to(self.device), tokens]
        ).tolist()
        return {
            "train/loss": loss,
            "train/lr": lr,
            "train/grad_norm": grad_norm,
            "train/skipped_step": skipped,
            "train/loss_tokens": n_tokens,
            "timing_s/step": time.perf_counter() - start,
        }

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Token-mean response NLL over the validation set (all ranks)."""
        self.module.eval()
        totals = torch.zeros(2, device=self.device)  # (nll sum, tokens)
        for batch in self._val_batches():
            for mb in self._micro_batches(batch):
                totals += torch.stack([self._nll_sum(mb), mb["loss_mask"][:, 1:].sum().float()])
        nll, tokens = _all_reduce_sum(totals).tolist()
        return nll / max(tokens, 1.0)

    # --- checkpoints --------------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> str:
        """Write ``global_step_<step>`` as a Hugging Face directory (rank 0), with the training state of
        ``checkpoint.save_contents`` in its ``engine/`` (all ranks; collective). All ranks call."""
        out = os.path.join(self.config.trainer.local_dir, f"global_step_{step}")
        state = self.engine.full_state_dict()  # a collective under FSDP; LoRA: merged, plain names
        adapter = self.engine.adapter_state_dict() if self.engine.lora is not None else None  # a collective too
        if self.rank == 0:
            os.makedirs(out, exist_ok=True)
            model = self.engine.hf_model
            tied = _tied_duplicates(model)
            state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in state.items() if k not in tied}
            model.save_pretrained(out, state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(out)
            if adapter is not None:  # what model.lora_adapter_path (SFT or RL) continues from
                write_adapter_weights(os.path.join(out, LORA_ADAPTER_DIR), adapter)
                self.engine.save_adapter_config(os.path.join(out, LORA_ADAPTER_DIR))
        del state, adapter
        training_state = TRAINING_STATE & set(self.config.checkpoint.save_contents)
        if training_state:
            save_engine_checkpoint(
                self.engine,
                os.path.join(out, ENGINE_STATE_DIR),
                extra_state={"global_step": step},
                save_contents=training_state,
            )
        if self.rank == 0:
            with open(os.path.join(self.config.trainer.local_dir, LATEST_FILE), "w") as f:
                f.write(str(step))  # written last: the directory is complete
            self._drop_old_checkpoints()
            self._say(logging.INFO, f"saved Hugging Face model to {out}")
            if self.config.trainer.default_hdfs_dir:
                copy = copy_checkpoint(out, self.config.trainer.default_hdfs_dir, step, LATEST_FILE)
                self._say(logging.INFO, f"copied the checkpoint to {copy}")
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        return out

    def _resume_dir(self) -> str | None:
        """The ``global_step_N`` directory this run continues (``trainer.resume_mode``), or None."""
        run = self.config.trainer
        if run.resume_mode == "disable":
            return None
        if run.resume_mode == "resume_path":
            path = os.path.abspath(os.path.expanduser(str(run.resume_from_path)))
            if not os.path.isdir(path):
                raise FileNotFoundError(f"trainer.resume_from_path={run.resume_from_path!r} is not a directory")
            return path
        path = latest_hf_dir(run.local_dir)  # auto: the newest complete checkpoint, if any
        if path is not None and not os.path.isdir(path):
            raise FileNotFoundError(
                f"trainer.resume_mode=auto: {os.path.join(run.local_dir, LATEST_FILE)} names {path}, which does "
                "not exist; set trainer.resume_mode=disable to start over"
            )
        return path

    def _load_training_state(self, path: str) -> int:
        """Weights, AdamW, LR schedule and RNG from ``path``'s ``engine/`` (``checkpoint.load_contents``);
        returns the step it was written at. All ranks call (collective)."""
        mode, contents = self.config.trainer.resume_mode, TRAINING_STATE & set(self.config.checkpoint.load_contents)
        state_dir = os.path.join(path, ENGINE_STATE_DIR)
        if not os.path.isdir(state_dir):
            raise ValueError(
                f"trainer.resume_mode={mode}: checkpoint {path} holds no training state ({ENGINE_STATE_DIR}/ is "
                "missing: it was saved without model/optimizer/extra in checkpoint.save_contents, or by an earlier "
                f"hybridflow); set trainer.resume_mode=disable to start over (its checkpoints are replaced), or "
                f"model.path={path} to start from its weights"
            )
        if not {"model", "extra"} <= contents:
            raise ConfigError(
                f"trainer.resume_mode={mode} reads the weights and the step: checkpoint.load_contents must hold "
                f"model and extra, got {list(self.config.checkpoint.load_contents)}"
            )
        extra = load_engine_checkpoint(self.engine, state_dir, contents)
        step = int((extra or {}).get("global_step", -1))
        if step < 0:
            raise ValueError(f"checkpoint {state_dir} records no global_step in its extra state")
        self._say(logging.INFO, f"resumed from {path} at step {step} of {self.total_steps}")
        return step

    def _drop_old_checkpoints(self) -> None:
        keep = self.config.trainer.max_ckpt_to_keep
        if not keep or keep <= 0:
            return
        root = self.config.trainer.local_dir
        steps = sorted(
            int(d.split("_")[-1])
            for d in os.listdir(root)
            if d.startswith("global_step_") and d.split("_")[-1].isdigit()
        )
        for old in steps[:-keep]:
            shutil.rmtree(os.path.join(root, f"global_step_{old}"), ignore_errors=True)

    def _stop_profiling(self) -> None:
        if paths := self.profiler.stop():
            logger.info(
                "rank %d: wrote the profile of steps %s to %s", self.rank, self.config.trainer.profile_interval, paths
            )

    # --- logging ------------------------------------------------------------------------------------
    def _say(self, level: int, text: str) -> None:
        """A message of the run, once (rank 0)."""
        if self.rank == 0:
            logger.log(level, text)

    def log(self, metrics: dict, step: int) -> None:
        run = self.config.trainer
        if self.rank != 0 or not run.loggers:
            return
        if self._log_file is None:  # the tracker, made on first use (rank 0 only)
            self._log_file = Tracking("hybridflow_sft", "sft", list(run.loggers), log_dir=run.local_dir)
        self._log_file.log(metrics, step)

    # --- the loop -----------------------------------------------------------------------------------
    def fit(self) -> str:
        """Train for ``total_steps``; validate every test_freq and at the end; save every save_freq and
        at the end. Returns the final Hugging Face directory."""
        try:
            return self._fit()
        finally:
            self._stop_profiling()  # a run that fails inside the window still writes its trace

    def _fit(self) -> str:
        run, final_dir = self.config.trainer, self.resumed_from
        epoch, start = divmod(self.global_step, self.steps_per_epoch)  # a resumed run's place in the data
        first, last = (int(v) for v in run.profile_interval)
        while self.global_step < self.total_steps:
            for batch in self.train_batches(epoch, start):
                self.global_step += 1
                step = self.global_step
                if step == first:
                    self.profiler.start(step)
                metrics = self.training_step(batch)
                if step == last:
                    self._stop_profiling()
                metrics["train/epoch"] = epoch
                is_last = step == self.total_steps
                if self.val_dataset is not None and (is_last or (run.test_freq > 0 and step % run.test_freq == 0)):
                    metrics["val/loss"] = self.validation_loss()
                self.log(metrics, step)
                if is_last or (run.save_freq > 0 and step % run.save_freq == 0):
                    final_dir = self.save_checkpoint(step)
                if is_last:
                    break
            epoch, start = epoch + 1, 0
        if final_dir is None:  # total_steps == 0 (a resumed run that had nothing left returns its checkpoint)
            final_dir = self.save_checkpoint(self.global_step)
        if self._log_file is not None:
            self._log_file.finish()
            self._log_file = None
        return final_dir
