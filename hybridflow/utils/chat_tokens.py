"""Token-in-token-out for multi-turn conversations: the chat template applied incrementally.

A trajectory's tokens are built once and never re-derived from decoded text:

    prompt_ids      the template applied to the dataset's messages (+ tool schemas), generation prompt on
    model tokens    exactly what the engine sampled (mask 1)
    appended tokens the template's *delta* for the new tool / user messages (mask 0)

The delta of appended messages is the text the template adds when they follow an assistant turn:
``render(base + new, generation prompt) - render(base)`` for a fixed base conversation that ends with
an assistant message, prefixed by whatever of the assistant turn's closing the model did not sample
itself (for ChatML: the model samples ``<|im_end|>``, the template also writes the ``\\n`` after it). The
model's own text is never part of a delta, so re-tokenization drift cannot reach the trained tokens.

The sanity check (``multi_turn.tokenization_sanity_check_mode``) compares the finished trajectory with
the template applied to the whole conversation at once (assistant turns as the literal text the model
produced). ``strict`` fails the sample on any difference, with the first differing position;
``ignore_strippable`` fails only when a differing stretch is more than whitespace; ``disable`` skips it.
(``check`` raises ``TokenizationMismatch``; ``tool_agent`` turns that into a failed sample: logged, counted
in ``agent/tokenization_mismatch``, all its response tokens masked out of the loss.)
A difference means a text-level pipeline (decode, re-template, re-tokenize) would have trained on
different tokens than the ones sampled: a template whose rendering depends on later turns, a model that
sampled a non-canonical tokenization, special tokens inside generated text.
"""

from __future__ import annotations

import difflib

SENTINEL = "HYBRIDFLOW_ASSISTANT_TURN"
_BASE = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": SENTINEL})


class TokenizationMismatch(ValueError):
    """The incremental token ids differ from a full re-application of the chat template."""


class ChatTokenizer:
    """Chat-template rendering and the incremental token ids of a conversation (see the module docstring)."""

    def __init__(self, tokenizer, chat_template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self._closing: str | None = None

    # ------------------------------------------------------------------------------ rendering
    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The first prompt: the messages rendered with the generation prompt."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    # ------------------------------------------------------------------------------ deltas
    @property
    def assistant_closing(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n`` for ChatML)."""
        if self._closing is None:
            text = self.render(list(_BASE))
            self._closing = text[text.rindex(SENTINEL) + len(SENTINEL) :]
        return self._closing

    def split_turn(self, model_ids: list[int]) -> tuple[str, str]:
        """(the assistant content as text, the part of the turn's closing the model did not sample).

        The model usually samples the beginning of the closing (its end-of-turn token): the longest
        prefix of the closing that ends the generated text is that part."""
        text, closing = self.decode(model_ids), self.assistant_closing
        for k in range(len(closing), 0, -1):
            if text.endswith(closing[:k]):
                return text[: len(text) - k], closing[k:]
        return text, closing

    def delta_text(self, new_messages: list[dict], tools: list[dict] | None = None) -> str:
        """The text the template adds for ``new_messages`` after an assistant turn, generation prompt included."""
        before = self.render(list(_BASE), tools)
        after = self.render(list(_BASE) + list(new_messages), tools, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError(
                "the chat template renders the earlier turns differently once messages are appended, so "
                "the appended turns have no token delta; use a template that renders turns as a prefix"
            )
        return after[len(before) :]

    def append_ids(
        self, new_messages: list[dict], last_model_ids: list[int], tools: list[dict] | None = None
    ) -> list[int]:
        """Tokens (mask 0) for ``new_messages`` after the model turn ``last_model_ids``: the rest of that
        turn's closing, the new messages, and the next generation prompt."""
        _, rest = self.split_turn(last_model_ids)
        return self.encode(rest + self.delta_text(new_messages, tools))

    # ------------------------------------------------------------------------------ sanity check
    def check(
        self,
        ids: list[int],
        messages: list[dict],
        tools: list[dict] | None,
        mode: str,
        last_model_ids: list[int] | None = None,
        prompt_length: int = 0,
    ) -> bool:
        """Compare ``ids`` (prompt + response so far) with the template applied to ``messages`` at once.

        ``last_model_ids``: the final model turn when the conversation ends with one (its closing is
        added to ``ids`` first, as the template would write it); None when it ends with appended turns
        (compared with the generation prompt on). Returns True when they match, False when they differ
        only in whitespace (``ignore_strippable``); raises TokenizationMismatch otherwise.
        """
        if mode == "disable":
            return True
        expected = list(ids)
        if last_model_ids is not None:
            expected += self.encode(self.split_turn(last_model_ids)[1])
        full = self.encode(self.render(messages, tools, add_generation_prompt=last_model_ids is None))
        if expected == full:
            return True
        chunks = [
            (expected[i1:i2], full[j1:j2])
            for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, expected, full, autojunk=False).get_opcodes()
            if op != "equal"
        ]
        if mode == "ignore_strippable" and all(
            not self.decode(a).strip() and not self.decode(b).strip() for a, b in chunks
        ):
            return False
        raise TokenizationMismatch(self._describe(expected, full, mode, prompt_length))

    def _describe(self, expected: list[int], full: list[int], mode: str, prompt_length: int) -> str:
        pos = next((i for i, (a, b) in enumerate(zip(expected, full)) if a != b), min(len(expected), len(full)))
        where = f"response token {pos - prompt_length}" if pos >= prompt_length else f"prompt token {pos}"
        lo = max(0, pos - 12)
        return (
            f"tokenization sanity check ({mode}) failed: the trajectory's token ids (prompt + sampled + appended, "
            f"{len(expected)} tokens) and the chat template applied to the whole conversation ({len(full)} tokens) "
            f"first differ at position {pos} ({where}): trajectory ids {expected[pos : pos + 8]} "
            f"{self.decode(expected[lo : pos + 12])!r} vs re-templated ids {full[pos : pos + 8]} "
            f"{self.decode(full[lo : pos + 12])!r} (context from position {lo}). Training uses the trajectory's ids; "
            "if this difference is expected for your chat template set "
            "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=ignore_strippable or disable"
        )
