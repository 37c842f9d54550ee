"""RewardModelWorker: scores responses with a sequence-classification model (reward_model.enable=True).

The score of a row is the model's output at the last valid token; it is written as ``rm_scores`` on
the last valid response token, where the reward manager picks it up.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from hybridflow.config.convert import as_section
from hybridflow.config.legacy import LegacyRewardModelConfig
from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import Dispatch, Worker, register
from hybridflow.single_controller.base.worker import default_device_backend
from hybridflow.workers.model_loading import import_external_lib, load_model, load_tokenizer, local_model_path
from hybridflow.workers.utils.micro_batches import split_fixed


def scores_on_last_response_token(
    scores: torch.Tensor, attention_mask: torch.Tensor, response_length: int
) -> torch.Tensor:
    """(B,) scores → (B, R) with each score on the row's last valid response token."""
    response_mask = attention_mask[:, -response_length:]
    last = (response_mask.sum(-1) - 1).clamp(min=0)  # (B,)
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    out[torch.arange(len(scores)), last] = scores.float()
    return out


class RewardModelWorker(Worker):
    """``config`` is the ``reward_model`` section (veRL's earlier one: its model.path reads the same as
    reward.reward_model.model_path after loading). Inputs share the policy's tokenizer
    (reward_model.model.input_tokenizer must be null; the config key table refuses anything else)."""

    def __init__(self, config):
        super().__init__()
        self.config = as_section(config, LegacyRewardModelConfig, "reward_model")  # the door: a DictConfig or dict
        self.init_process_group()
        self.device, _ = default_device_backend()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        model_cfg = self.config.model
        import_external_lib(model_cfg.external_lib)
        path = local_model_path(model_cfg.path, "reward.reward_model.model_path")
        trust = bool(model_cfg.trust_remote_code)
        self.tokenizer = load_tokenizer(path, trust)
        self.module = (
            load_model(path, "sequence_classification", num_labels=1, trust_remote_code=trust).to(self.device).eval()
        )
        # micro_batch_size_per_gpu, or the deprecated global micro_batch_size split over the ranks
        # (config checks make sure one of them is set)
        world = dist.get_world_size() if dist.is_initialized() else 1
        per_gpu, total = self.config.micro_batch_size_per_gpu, self.config.micro_batch_size
        self.micro_batch_size = int(per_gpu) if per_gpu else max(1, int(total) // world)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        keys = ["input_ids", "attention_mask", "position_ids", "responses"]
        scores = []
        with torch.no_grad():
            for micro in split_fixed(data.select(batch_keys=keys), self.micro_batch_size):
                b = micro.batch
                out = self.module(
                    input_ids=b["input_ids"].to(self.device),
                    attention_mask=b["attention_mask"].to(self.device),
                    position_ids=b["position_ids"].to(self.device),
                )
                scores.append(out.logits[:, 0].float().cpu())  # HF pools at the last non-pad token
        scores = torch.cat(scores)
        rm = scores_on_last_response_token(scores, data.batch["attention_mask"], data.batch["responses"].shape[-1])
        return DataProto.from_dict(
            tensors={"rm_scores": rm}, meta_info={"metrics": {"timing_s/worker_rm": [time.perf_counter() - start]}}
        )
