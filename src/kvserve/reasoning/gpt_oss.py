"""``openai_gptoss``: GPT-OSS's harmony channels as ``reasoning_content`` and ``content``.

The name and the split are vLLM's (``GptOssReasoningParser`` and ``parse_chat_output`` in
``vllm/entrypoints/.../harmony.py``): the ``analysis`` messages are the reasoning, the ``final``
messages and the ``commentary`` preambles (no recipient) the content; several messages of one
kind are joined with ``\\n``. Tool calls (``to=functions.NAME``) are neither: the ``openai`` tool
parser reads them (:mod:`kvserve.tool_parsers.gpt_oss`). The text is read by
:class:`kvserve.harmony.HarmonyReader`, also for its best effort on broken output.

The grammar of a structured output applies to the final message only: the reasoning has ended
when the ids end inside a ``final`` message's body (the last ``<|message|>`` closes a header whose
channel is ``final``, and no message boundary follows it). So a prompt ending in
``<|start|>assistant`` has not ended it, whatever earlier turns held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvserve import harmony
from kvserve.reasoning.abstract import (ReasoningParser, ReasoningState, register_reasoning_parser,
                                        vocabulary_token_id)


@register_reasoning_parser("openai_gptoss")
class GptOssReasoningParser(ReasoningParser):
    """Harmony's ``analysis`` channel as reasoning, ``final`` and preambles as content.

    Raises:
        ValueError: the tokenizer lacks one of harmony's markers as a token.
    """

    def __init__(self, tokenizer: Any, *, chat_template_kwargs: Mapping[str, Any] | None = None):
        super().__init__(tokenizer, chat_template_kwargs=chat_template_kwargs)
        ids = {marker: vocabulary_token_id(tokenizer, marker) for marker in harmony.MARKERS}
        missing = [marker for marker, token_id in ids.items() if token_id is None]
        if missing:
            raise ValueError(f"the {self.name} reasoning parser needs harmony's markers as tokens of the "
                             f"model's vocabulary (GPT-OSS's o200k_harmony); this tokenizer lacks "
                             f"{', '.join(missing)}")
        self._marker_ids = frozenset(ids.values())
        self._message_id = ids[harmony.MESSAGE]
        self._boundary_ids = frozenset(ids[m] for m in (harmony.START, *harmony.ENDS))
        self._header_ids = frozenset(ids[m] for m in (harmony.CHANNEL, harmony.CONSTRAIN))
        self._channel_id = ids[harmony.CHANNEL]
        self._reader = harmony.HarmonyReader()

    def marker_token_ids(self) -> frozenset[int]:
        return self._marker_ids

    def split(self, text: str, final: bool) -> ReasoningState:
        if not text.startswith(self._reader.text):  # a new text: a stream only extends its text
            self._reader = harmony.HarmonyReader()
        self._reader.feed(text)
        messages = self._reader.state(final)
        return ReasoningState(reasoning=harmony.joined(messages, "reasoning"),
                              content=harmony.joined(messages, "content"),
                              reasoning_ended=any(m.header.channel == "final" for m in messages))

    def _final_body_start(self, token_ids: Sequence[int]) -> int | None:
        """Where the body of the final message that ``token_ids`` end inside starts, or None."""
        for i in range(len(token_ids) - 1, -1, -1):
            token = token_ids[i]
            if token == self._message_id:
                return i + 1 if self._header_before(token_ids, i).channel == "final" else None
            if token in self._boundary_ids or token in self._header_ids:
                return None
        return None

    def _header_before(self, token_ids: Sequence[int], message_at: int) -> harmony.Header:
        start = message_at
        while start > 0 and token_ids[start - 1] not in self._boundary_ids and token_ids[start - 1] != self._message_id:
            start -= 1
        text = self.tokenizer.decode(list(token_ids[start:message_at]), skip_special_tokens=False)
        return harmony.parse_header(text)

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        return self._final_body_start(token_ids) is not None

    def content_token_ids(self, token_ids: Sequence[int]) -> list[int]:
        start = self._final_body_start(token_ids)
        return [] if start is None else list(token_ids[start:])

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """The tokens of the reasoning messages' bodies (markers and headers excluded), message
        by message as the text reader splits them."""
        count, header_start, in_body, reasoning = 0, 0, False, False
        for i, token in enumerate(token_ids):
            if token == self._message_id and not in_body:
                header = self.tokenizer.decode(list(token_ids[header_start:i]), skip_special_tokens=False)
                in_body = True
                reasoning = harmony.message_kind(harmony.parse_header(header)) == "reasoning"
            elif token in self._boundary_ids:
                in_body, reasoning, header_start = False, False, i + 1
            elif token == self._channel_id and in_body:  # a new header without <|end|>
                in_body, reasoning, header_start = False, False, i
            elif in_body and token not in self._marker_ids:
                count += reasoning
        return count
