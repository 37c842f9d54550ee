"""Token-in-token-out for multi-turn conversations: the chat template applied incrementally.

A trajectory's tokens are built once and never re-derived from decoded text:

    prompt_ids      the template applied to the dataset's messages (+ tool schemas), generation prompt on
    model tokens    exactly what the engine sampled (mask 1)
    appended tokens the template's *delta* for the new tool / user messages (mask 0)

The delta of appended messages is the text the template adds when they follow an assistant turn: what
``render(base + new, generation prompt)`` writes after the base conversation's assistant turn and its
closing (a fixed base that ends with an assistant message), prefixed by whatever of that closing the model
did not sample itself (for ChatML: the model samples ``<|im_end|>``, the template also writes the ``\\n``
after it). The model's own text is never part of a delta, so re-tokenization drift cannot reach the trained
tokens. A template that rewrites earlier turns once another follows (Qwen3's drops their reasoning) does not
change a delta: the trajectory keeps each turn as the model produced it, as veRL's agent loop does.

The sanity check (``multi_turn.tokenization_sanity_check_mode``) compares the finished trajectory with
the template applied to the conversation's text turn by turn (``incremental_text``: assistant turns as the
literal text the model produced, each rendered as the newest turn; for most templates the whole
conversation rendered at once). ``strict`` fails the sample on any difference, with the first differing position;
``ignore_strippable`` fails only when a differing stretch is more than whitespace; ``disable`` skips it.
(``check`` raises ``TokenizationMismatch``; ``tool_agent`` turns that into a failed sample: logged, counted
in ``agent/tokenization_mismatch``, all its response tokens masked out of the loss.)
A difference means a text-level pipeline (decode, re-template, re-tokenize) would have trained on
different tokens than the ones sampled: a model that sampled a non-canonical tokenization, special tokens
inside generated text, a template whose closing of a turn depends on what follows.
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

    def delta_text(
        self, new_messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True
    ) -> str:
        """The text the template adds for ``new_messages`` after an assistant turn (and its closing), generation
        prompt included. Read after the base assistant turn's content and closing, so a template that rewrites
        an earlier turn once another follows (Qwen3 drops the reasoning, even an empty one, of every turn but
        the newest) still has a delta."""
        after = self.render(list(_BASE) + list(new_messages), tools, add_generation_prompt=add_generation_prompt)
        at = after.rfind(SENTINEL)
        tail = after[at + len(SENTINEL) :] if at >= 0 else ""
        if at < 0 or not tail.startswith(self.assistant_closing):
            raise ValueError(
                "the chat template does not close an assistant turn the same way once messages follow it, so the "
                f"appended turns have no token delta (closing {self.assistant_closing!r}, then {tail[:40]!r})"
            )
        return tail[len(self.assistant_closing) :]

    def turn_text(self, messages: list[dict], i: int, tools: list[dict] | None = None) -> str:
        """Assistant message ``i`` as the template renders it when it is the newest turn: its content and closing,
        after the generation prompt (the reasoning that a Qwen3 template drops from earlier turns is kept)."""
        start = self.render(messages[:i], tools, add_generation_prompt=True)
        upto = self.render(messages[: i + 1], tools)
        if not upto.startswith(start):
            raise ValueError(
                f"the chat template does not render assistant message {i} after its generation prompt "
                f"(prompt ends {start[-40:]!r}, the rendered turn {upto[len(start) - 40 : len(start) + 20]!r}); "
                "a thinking switch (enable_thinking) that contradicts the message is a common cause"
            )
        return upto[len(start) :]

    def incremental_segments(
        self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False
    ) -> list[tuple[bool, str]]:
        """The conversation as the model meets it turn by turn, as (is an assistant turn, text) pieces: the first
        prompt, each assistant turn as rendered when newest (content and closing), the deltas of the messages
        between. Joined, equal to ``render(messages)`` for a template that renders turns as a prefix of the
        next; a Qwen3 template's whole-conversation render drops the earlier turns' reasoning, this keeps it."""
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if not turns:
            return [(False, self.render(messages, tools, add_generation_prompt=add_generation_prompt))]
        pieces = [(False, self.render(messages[: turns[0]], tools, add_generation_prompt=True))]
        for k, i in enumerate(turns):
            pieces.append((True, self.turn_text(messages, i, tools)))
            last = k + 1 == len(turns)
            between = messages[i + 1 : len(messages) if last else turns[k + 1]]
            if between or not last or add_generation_prompt:
                gen = not last or add_generation_prompt
                pieces.append((False, self.delta_text(between, tools, add_generation_prompt=gen)))
        return pieces

    def incremental_text(
        self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = False
    ) -> str:
        """``incremental_segments`` joined: the text of a token-in-token-out trajectory of ``messages``."""
        return "".join(text for _, text in self.incremental_segments(messages, tools, add_generation_prompt))

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
        """Compare ``ids`` (prompt + response so far) with the template applied to ``messages``' text turn by turn.

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
        try:
            text = self.incremental_text(messages, tools, add_generation_prompt=last_model_ids is None)
        except ValueError as err:  # the template cannot render a turn as written: this sample fails, not the run
            raise TokenizationMismatch(f"tokenization sanity check ({mode}) failed: {err}") from err
        full = self.encode(text)
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
            f"{len(expected)} tokens) and the chat template applied to the conversation's text ({len(full)} tokens) "
            f"first differ at position {pos} ({where}): trajectory ids {expected[pos : pos + 8]} "
            f"{self.decode(expected[lo : pos + 12])!r} vs re-templated ids {full[pos : pos + 8]} "
            f"{self.decode(full[lo : pos + 12])!r} (context from position {lo}). Training uses the trajectory's ids; "
            "if this difference is expected for your chat template set "
            "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=ignore_strippable or disable"
        )
