"""RewardModelWorker: scores responses with a sequence-classification model (reward_model.enable=True).

The score of a row is the model's output at the last valid token; it is written as ``rm_scores`` on
the last valid response token, where the reward manager picks it up.
"""

from __future__ import annotations

import time

import torch

from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import Dispatch, Worker, register
from hybridflow.single_controller.base.worker import default_device_backend
from hybridflow.workers.actor_rollout_ref_worker import _plain
from hybridflow.workers.model_loading import import_external_lib, load_model, load_tokenizer, local_model_path
from hybridflow.workers.utils.micro_batches import split_fixed


def scores_on_last_response_token(scores: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """(B,) scores → (B, R) with each score on the row's last valid response token."""
    response_mask = attention_mask[:, -response_length:]
    last = (response_mask.sum(-1) - 1).clamp(min=0)  # (B,)
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    out[torch.arange(len(scores)), last] = scores.float()
    return out


class RewardModelWorker(Worker):
    """``config`` is the ``reward_model`` section. Inputs share the policy's tokenizer (veRL's
    input_tokenizer switch for a different RM tokenizer is not supported yet: it raises)."""

    def __init__(self, config):
        super().__init__()
        self.config = _plain(config)
        self.init_process_group()
        self.device, _ = default_device_backend()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        model_cfg = self.config["model"]
        import_external_lib(model_cfg.get("external_lib"))
        path = local_model_path(model_cfg["path"], "reward_model.model.path")
        self.tokenizer = load_tokenizer(path, bool(model_cfg.get("trust_remote_code", False)))
        self.module = load_model(path, "sequence_classification", num_labels=1,
                                 trust_remote_code=bool(model_cfg.get("trust_remote_code", False))).to(self.device).eval()
        self.micro_batch_size = int(self.config.get("micro_batch_size_per_gpu") or 8)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        keys = ["input_ids", "attention_mask", "position_ids", "responses"]
        scores = []
        with torch.no_grad():
            for micro in split_fixed(data.select(batch_keys=keys), self.micro_batch_size):
                b = micro.batch
                out = self.module(input_ids=b["input_ids"].to(self.device), attention_mask=b["attention_mask"].to(self.device),
                                  position_ids=b["position_ids"].to(self.device))
                scores.append(out.logits[:, 0].float().cpu())  # HF pools at the last non-pad token
        scores = torch.cat(scores)
        rm = scores_on_last_response_token(scores, data.batch["attention_mask"], data.batch["responses"].shape[-1])
        return DataProto.from_dict(tensors={"rm_scores": rm},
                                   meta_info={"metrics": {"timing_s/worker_rm": [time.perf_counter() - start]}})
