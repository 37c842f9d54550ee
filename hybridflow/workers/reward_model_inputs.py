"""What a discriminative reward model reads, as veRL 0.9's reward loop builds it: the row's conversation
(``raw_prompt``) with the response appended as the assistant's turn, rendered by the reward model's own
chat template and tokenized by its own tokenizer. The policy's token ids are never fed to it, so a reward
model with another tokenizer or template (Skywork-Reward on a Qwen policy) scores what it was trained on.

The response is decoded by the policy's tokenizer with its special tokens (the EOS text removed), as
veRL decodes it; a leading BOS the template writes is dropped, because tokenizing adds it again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["reward_model_texts", "tokenize_right_padded"]


def _response_text(response_ids: torch.Tensor, valid: int, input_tokenizer) -> str:
    text = input_tokenizer.decode(response_ids[:valid].tolist())
    eos = input_tokenizer.eos_token
    return text.replace(eos, "") if eos else text


def reward_model_texts(
    raw_prompts: Sequence, responses: torch.Tensor, response_mask: torch.Tensor, input_tokenizer, rm_tokenizer
) -> list[str]:
    """One rendered conversation per row. ``raw_prompts``: each row's chat messages; ``responses`` /
    ``response_mask``: (B, R) generated ids and their valid positions."""
    texts = []
    valid_lengths = response_mask.sum(-1).tolist()
    for i, (messages, valid) in enumerate(zip(raw_prompts, valid_lengths, strict=True)):
        if messages is None or isinstance(messages, str):
            raise ValueError(
                f"row {i}: raw_prompt must be the prompt's chat messages (got {type(messages).__name__}); the "
                "reward model scores the conversation in its own chat template"
            )
        chat = [dict(m) for m in messages]
        chat.append({"role": "assistant", "content": _response_text(responses[i], int(valid), input_tokenizer)})
        try:
            text = rm_tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
        except Exception as err:  # a template's own error (jinja, a role it refuses): say which row
            raise ValueError(f"row {i}: the reward model's chat template failed on this conversation: {err}") from err
        bos = rm_tokenizer.bos_token
        if bos and text.startswith(bos):
            text = text[len(bos) :]
        texts.append(text)
    return texts


def tokenize_right_padded(texts: Sequence[str], tokenizer, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), each row's tokens first and ``pad_id`` after them; the special tokens
    the tokenizer adds (a BOS) included, as a serving engine tokenizes a prompt."""
    rows = [tokenizer(text, add_special_tokens=True)["input_ids"] for text in texts]
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask
