"""Tiny models + PPO batch builders shared by the worker tests (imported as
tests.workers.actor.ppo_batch)."""

import torch

from hybridflow.models.tiny import build_tiny_config, build_tiny_model
from hybridflow.protocol import DataProto

VOCAB, PROMPT, RESPONSE = 16, 6, 5
# the shared tiny model (hybridflow/models/tiny.py) at this file's small size: vocab 16, hidden 32,
# 2 layers, 4 heads (2 KV), no pad or EOS id in the config (the rows' pad id 0 is an ordinary token)
SIZE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=64,
    pad_token_id=None,
    eos_token_id=None,
)


def tiny_causal_lm(seed: int = 0):
    """A Qwen2ForCausalLM with its own lm_head (untied); the global RNG is left alone."""
    return build_tiny_model(build_tiny_config(VOCAB, tie_word_embeddings=False, **SIZE), seed=seed)


def tiny_value_model(seed: int = 0, pad_token_id=None):
    """The critic's shape of ``tiny_causal_lm``: a Qwen2ForTokenClassification with one label per position,
    head dropout off (as the critic worker sets it, so values are deterministic). ``pad_token_id`` also
    zeroes that row of the embedding at init."""
    config = build_tiny_config(VOCAB, **{**SIZE, "pad_token_id": pad_token_id}, num_labels=1, classifier_dropout=0.0)
    return build_tiny_model(config, seed=seed, head="token_classification")


def padded_rows(batch_size: int, seed: int = 0, prompt_lens=None, response_lens=None) -> dict:
    """Left-padded prompts + right-padded responses with varying lengths (pad id 0)."""
    gen = torch.Generator().manual_seed(seed)
    if prompt_lens is None:
        prompt_lens = torch.randint(1, PROMPT + 1, (batch_size,), generator=gen)
    if response_lens is None:
        response_lens = torch.randint(1, RESPONSE + 1, (batch_size,), generator=gen)
    prompt_lens, response_lens = torch.as_tensor(prompt_lens), torch.as_tensor(response_lens)
    pos_p, pos_r = torch.arange(PROMPT), torch.arange(RESPONSE)
    prompt_mask = (pos_p >= PROMPT - prompt_lens.unsqueeze(1)).long()  # (B, P) left padded
    response_mask = (pos_r < response_lens.unsqueeze(1)).long()  # (B, R) right padded
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)  # (B, P+R)
    input_ids = torch.randint(1, VOCAB, (batch_size, PROMPT + RESPONSE), generator=gen) * attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": input_ids[:, PROMPT:],
        "response_mask": response_mask,
    }


def actor_config(**overrides) -> dict:
    """The yaml's actor section with the values these tests rely on."""
    from tests.yaml_sections import actor

    return actor(
        **{
            "ppo_mini_batch_size": 8,
            "ppo_micro_batch_size_per_gpu": 8,
            "use_dynamic_bsz": False,
            "ppo_max_token_len_per_gpu": 64,
            "ppo_epochs": 1,
            "shuffle": False,
            "grad_clip": None,
            "clip_ratio": 0.2,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.0,
            "use_kl_loss": False,
            "kl_loss_coef": 0.1,
            "kl_loss_type": "low_var_kl",
            "policy_loss": {"loss_mode": "vanilla"},
            **overrides,
        }
    )


def ppo_batch(
    model, batch_size: int = 8, seed: int = 0, temperature: float = 1.0, noise: float = 0.3, **lens
) -> DataProto:
    """Rows + old_log_probs (current policy's, perturbed by ``noise`` so ratios differ from 1),
    ref_log_prob and advantages."""
    from hybridflow.workers.utils.logprob import forward_response_log_probs

    rows = padded_rows(batch_size, seed, **lens)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        log_probs, _ = forward_response_log_probs(
            model, rows["input_ids"], rows["attention_mask"], rows["position_ids"], RESPONSE, temperature
        )
    shape = log_probs.shape
    rows["old_log_probs"] = log_probs + noise * torch.randn(shape, generator=gen)
    rows["ref_log_prob"] = log_probs + noise * torch.randn(shape, generator=gen)
    rows["advantages"] = torch.randn(shape, generator=gen)
    return DataProto.from_dict(tensors=rows, meta_info={"temperature": temperature})


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
