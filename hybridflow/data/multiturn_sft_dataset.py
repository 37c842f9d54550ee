"""Multi-turn SFT over parquet (veRL's ``data.multiturn``: ``messages_key``, ``tools_key``).

A row is a conversation (chat messages, assistant turns possibly with ``tool_calls``, ``tool`` turns
with results) and optionally the OpenAI tool schemas the chat template shows. The loss is on exactly
the tokens the model would sample in the multi-turn rollout: each assistant message's content and its
end-of-turn token; the prompt, tool results, user turns and the template's text around them
(``<|im_start|>assistant\\n``, the ``\\n`` after ``<|im_end|>``) are context only. The token ids are built
segment by segment the way the rollout builds them (``hybridflow.utils.chat_tokens``), so a
model trained here sees, at RL time, the same tokens it was trained on.

Columns may hold lists of dicts or JSON strings; ``None`` entries (parquet fills absent struct fields
with them) are dropped, as ``model_dump(exclude_none=True)`` drops them for the rollout's schemas.
Items follow ``SFTDataset``'s layout (right-padded, ``loss_mask`` 1 on target tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import Dataset

from hybridflow.config.sft_trainer import SFTDataConfig
from hybridflow.data.rl_dataset import pad_ids, position_ids_from_mask, read_parquet_rows, require_chat_template
from hybridflow.data.row_limit import limit_rows
from hybridflow.data.sft_dataset import sft_data_config
from hybridflow.utils.chat_tokens import ChatTokenizer


def drop_none(value: Any) -> Any:
    """``value`` with None entries removed from every dict inside it."""
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [drop_none(v) for v in value]
    return value


def _column(value: Any) -> Any:
    if isinstance(value, str):
        value = json.loads(value)
    return drop_none(value) if value is not None else None


def conversation_ids(
    chat: ChatTokenizer, messages: list[dict], tools: list[dict] | None = None, ignore_input_ids_mismatch: bool = False
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a whole conversation as the model meets it turn by turn (the tokens the tool
    agent builds at RL time); loss 1 on each assistant turn's content and end-of-turn token.

    A template that rewrites earlier turns once another follows (Qwen3's drops their reasoning) renders the
    conversation at once differently: an error naming the first difference, unless
    ``ignore_input_ids_mismatch`` (veRL's key, set in its Qwen3 SFT example) takes the turn-by-turn text, every
    assistant turn as written."""
    eos = chat.tokenizer.eos_token or ""
    closing = chat.assistant_closing
    rest = closing[len(eos) :] if eos and closing.startswith(eos) else ""
    ids: list[int] = []
    mask: list[int] = []

    def add(text: str, loss: int) -> None:
        piece = chat.encode(text) if text else []
        ids.extend(piece)
        mask.extend([loss] * len(piece))

    pieces = chat.incremental_segments(messages, tools)
    for is_turn, text in pieces:
        if not is_turn:
            add(text, 0)
            continue
        end = len(text) - len(rest) if rest and text.endswith(rest) else len(text)
        add(text[:end], 1)  # the content and the end-of-turn token the model writes
        add(text[end:], 0)  # what the template writes after it (ChatML's "\n")
    if not ignore_input_ids_mismatch:
        built, whole = "".join(text for _, text in pieces), chat.render(messages, tools)
        if built != whole:
            at = next((k for k, (x, y) in enumerate(zip(built, whole)) if x != y), min(len(built), len(whole)))
            raise ValueError(
                "the chat template renders the conversation at once differently from turn by turn (as Qwen3's "
                f"drops the reasoning of earlier turns): first difference at character {at}, turn by turn "
                f"{built[max(0, at - 30) : at + 30]!r} vs at once {whole[max(0, at - 30) : at + 30]!r}. Set "
                "data.ignore_input_ids_mismatch=True to train on the turn-by-turn tokens (each assistant turn as "
                "written, its reasoning kept), as veRL does"
            )
    return ids, mask


def thinking_switch(value: Any, what: str) -> bool | None:
    """A row's (or the default's) enable_thinking: a bool, 0/1, or true/false/none as text; None: not passed."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, (bool, int)) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{what}={value!r} is not an enable_thinking switch (true, false or none)")


def _earlier_or(earlier: str | None, key: str, default: str) -> str:
    """``data.<key>``, or veRL's earlier ``data.multiturn.<key>`` where the new key is at its default."""
    return earlier if earlier and key == default else key


class MultiTurnSFTDataset(Dataset):
    """``config``: the SFT ``data`` section, an ``SFTDataConfig`` (a DictConfig or dict is read into one):
    ``messages_key``, ``tools_key`` (veRL's earlier spellings ``multiturn.messages_key`` /
    ``multiturn.tools_key`` stand in for them where those are at their defaults), ``max_length``,
    ``truncation``: error | left | right, ``apply_chat_template_kwargs``. ``max_samples`` > 0: only the first
    that many rows."""

    def __init__(self, parquet_files, tokenizer, config: Mapping | SFTDataConfig | None = None, max_samples: int = -1):
        config = sft_data_config(config)
        self.messages_key = _earlier_or(config.multiturn.messages_key, config.messages_key, "messages")
        self.tools_key = _earlier_or(config.multiturn.tools_key, config.tools_key, "tools")
        self.max_length = int(config.max_length)
        self.truncation = config.truncation
        require_chat_template(tokenizer)
        self.tokenizer = tokenizer
        self.chat = ChatTokenizer(tokenizer, dict(config.apply_chat_template_kwargs))
        self.ignore_input_ids_mismatch = bool(config.ignore_input_ids_mismatch)
        thinking_key = _earlier_or(config.multiturn.enable_thinking_key, config.enable_thinking_key, "enable_thinking")
        rows = read_parquet_rows(parquet_files, required_column=self.messages_key)
        rows = limit_rows(rows, max_samples, what=str(parquet_files))  # the first rows (veRL's SFT data: no shuffle)
        self.conversations = [_column(r[self.messages_key]) for r in rows]
        self.tools = [_column(r.get(self.tools_key)) or None for r in rows]
        # veRL: the row's column when the data has it, else data.enable_thinking_default; None: not passed
        default = thinking_switch(config.enable_thinking_default, "data.enable_thinking_default")
        has_column = bool(rows) and thinking_key in rows[0]
        self.thinking = [
            thinking_switch(r.get(thinking_key), f"SFT row {i}: {thinking_key!r}") if has_column else default
            for i, r in enumerate(rows)
        ]
        self._chats = {None: self.chat}  # one ChatTokenizer per switch value
        for i, conv in enumerate(self.conversations):
            if not isinstance(conv, list) or not any(m.get("role") == "assistant" for m in conv):
                raise ValueError(
                    f"SFT row {i}: {self.messages_key!r} must be a list of chat messages with an assistant turn"
                )

    def __len__(self) -> int:
        return len(self.conversations)

    def _chat_for(self, thinking: bool | None) -> ChatTokenizer:
        """The chat template with ``enable_thinking=thinking`` among its arguments (None: as configured)."""
        if thinking not in self._chats:
            self._chats[thinking] = ChatTokenizer(self.tokenizer, {**self.chat.kwargs, "enable_thinking": thinking})
        return self._chats[thinking]

    def __getitem__(self, idx: int) -> dict:
        chat = self._chat_for(self.thinking[idx])
        try:
            ids, is_target = conversation_ids(
                chat, self.conversations[idx], self.tools[idx], self.ignore_input_ids_mismatch
            )
        except ValueError as err:
            err.add_note(f"in SFT row {idx} of {self.messages_key!r}")
            raise
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise ValueError(
                    f"SFT row {idx} has {len(ids)} tokens > max_length={self.max_length}; "
                    "set data.truncation to left or right"
                )
            cut = slice(len(ids) - self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
            ids, is_target = ids[cut], is_target[cut]
        input_ids, attention_mask = pad_ids(ids, self.max_length, self.tokenizer.pad_token_id, left=False)
        loss_mask = torch.zeros(self.max_length, dtype=torch.long)
        loss_mask[: len(is_target)] = torch.tensor(is_target, dtype=torch.long)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            "loss_mask": loss_mask,
        }
