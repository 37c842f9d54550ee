"""RewardModelWorker: scores responses with a sequence-classification model (reward_model.enable=True).

It reads each row as veRL 0.9's reward loop feeds a discriminative reward model: the prompt's messages
plus the decoded response, in the reward model's chat template and tokenizer (``reward_model_inputs``).
The score is the model's last label at the conversation's last token (a serving engine's last-token
pooling); it is written as ``rm_scores`` on the last valid response token, where the reward manager
picks it up.
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
from hybridflow.workers.reward_model_inputs import reward_model_texts, tokenize_right_padded
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
    reward.reward_model.model_path after loading). ``input_tokenizer``: where the tokenizer that decodes
    the policy's responses is (named by the config key ``input_tokenizer_key``; None: the reward model's)."""

    def __init__(self, config, input_tokenizer: str | None = None, input_tokenizer_key: str = "input_tokenizer"):
        super().__init__()
        self.config = as_section(config, LegacyRewardModelConfig, "reward_model")  # the door: a DictConfig or dict
        self.input_tokenizer_at = (input_tokenizer, input_tokenizer_key)
        self.init_process_group()
        self.device, _ = default_device_backend()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        model_cfg = self.config.model
        import_external_lib(model_cfg.external_lib)
        path = local_model_path(model_cfg.path, "reward.reward_model.model_path")
        trust = bool(model_cfg.trust_remote_code)
        self.tokenizer = load_tokenizer(path, trust)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"reward.reward_model.model_path={model_cfg.path}: its tokenizer has no chat template; the reward "
                "model reads each conversation in its own template (veRL 0.9's reward loop)"
            )
        where, key = self.input_tokenizer_at
        decoder_dir = local_model_path(where, key) if where else path
        self.input_tokenizer = self.tokenizer if decoder_dir == path else load_tokenizer(decoder_dir, trust)
        module = load_model(
            path,
            "sequence_classification",
            num_labels=1,
            override_config=dict(model_cfg.override_config or {}),
            trust_remote_code=trust,
        )
        self.pad_id = _pad_id(self.tokenizer)
        if module.config.pad_token_id is None:  # transformers refuses batches > 1 without one (its pooling)
            module.config.pad_token_id = self.pad_id
        self.module = module.to(self.device).eval()
        # micro_batch_size_per_gpu, or the deprecated global micro_batch_size split over the ranks
        # (config checks make sure one of them is set)
        world = dist.get_world_size() if dist.is_initialized() else 1
        per_gpu, total = self.config.micro_batch_size_per_gpu, self.config.micro_batch_size
        self.micro_batch_size = int(per_gpu) if per_gpu else max(1, int(total) // world)

    def _score(self, micro: DataProto) -> torch.Tensor:
        """(b,) scores of one micro-batch: the last label's logit at each conversation's last token."""
        raw = micro.non_tensor_batch.get("raw_prompt")
        if raw is None:
            raise KeyError(
                "the reward model scores the conversation (raw_prompt plus the response, veRL 0.9's input): this "
                "batch has no raw_prompt column (the RL dataset writes it for every row)"
            )
        responses = micro.batch["responses"]
        response_mask = micro.batch["attention_mask"][:, -responses.shape[-1] :]
        texts = reward_model_texts(raw, responses, response_mask, self.input_tokenizer, self.tokenizer)
        ids, mask = tokenize_right_padded(texts, self.tokenizer, self.pad_id)
        last = mask.sum(-1) - 1
        per_token = []
        head = getattr(self.module, "score", None)  # the head of transformers' *ForSequenceClassification
        hook = head.register_forward_hook(lambda _m, _i, out: per_token.append(out)) if head is not None else None
        try:
            out = self.module(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        finally:
            if hook is not None:
                hook.remove()
        if per_token:  # each row's own last token, whatever its id (the pooling of a serving engine)
            return per_token[0][torch.arange(len(texts)), last.to(per_token[0].device), -1].float().cpu()
        return out.logits[:, -1].float().cpu()  # a model without that head: its own pooling

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        with torch.no_grad():
            scores = [self._score(micro) for micro in split_fixed(data, self.micro_batch_size)]
        scores = torch.cat(scores)
        rm = scores_on_last_response_token(scores, data.batch["attention_mask"], data.batch["responses"].shape[-1])
        return DataProto.from_dict(
            tensors={"rm_scores": rm}, meta_info={"metrics": {"timing_s/worker_rm": [time.perf_counter() - start]}}
        )


def _pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate[0] if isinstance(candidate, list) else candidate)
    return 0
