"""``deepseek_r1`` and ``qwen3``: reasoning between ``<think>`` and ``</think>``.

Rules (vLLM's ``DeepSeekR1ReasoningParser`` / ``Qwen3ReasoningParser`` and their base
``BaseThinkingReasoningParser``):

* a ``<think>`` at the very start of the output is dropped: newer templates (DeepSeek-R1 since
  its 2025 template, Qwen3 thinking-2507) open the block in the prompt, so the output starts
  inside it, while older ones let the model write the tag;
* everything before ``</think>`` is reasoning, everything after it content; an output without
  ``</think>`` is all reasoning (truncated while thinking);
* ``qwen3`` honours ``enable_thinking: false`` (``chat_template_kwargs``): the template then
  writes an empty ``<think>\\n\\n</think>\\n\\n`` into the prompt and the whole output is
  content; ``deepseek_r1`` always reasons (its template has no such switch).

``is_reasoning_end`` looks at token ids from the end: ``</think>`` first means ended,
``<think>`` first (or neither) means not (vLLM's rule), so a prompt that already closed the
block starts the grammar at the first token. A ``<think>`` later than the output's start is
text, not a tag (vLLM would also strip it; a stream has sent it by then).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvserve.reasoning.abstract import (ReasoningDelta, ReasoningParser, ReasoningState,
                                        register_reasoning_parser, vocabulary_token_id)

START = "<think>"
END = "</think>"


def _partial_suffix(text: str, tag: str) -> int:
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class ThinkTagReasoningParser(ReasoningParser):
    """``<think>...</think>`` reasoning (see the module docstring)."""

    honours_enable_thinking = False

    def __init__(self, tokenizer: Any, *, chat_template_kwargs: Mapping[str, Any] | None = None):
        super().__init__(tokenizer, chat_template_kwargs=chat_template_kwargs)
        self.thinking = not (self.honours_enable_thinking
                             and self.chat_template_kwargs.get("enable_thinking") is False)
        self.start_token_id = vocabulary_token_id(tokenizer, START)
        self.end_token_id = vocabulary_token_id(tokenizer, END)
        self._streamed = False  # a stream's text only grows: searches resume where they stopped
        self._end = -1  # where END was found in the stream (-1: not yet)
        self._searched = 0  # the stream's text before this holds no END
        if self.thinking and (self.start_token_id is None or self.end_token_id is None):
            raise ValueError(f"the {self.name} reasoning parser needs {START} and {END} as "
                             "tokens of the model's vocabulary; this tokenizer has "
                             f"{'neither' if self.end_token_id is None else 'no ' + START}")

    def extract_reasoning_streaming(self, previous_text: str, current_text: str,
                                    delta_text: str) -> ReasoningDelta | None:
        self._streamed = True
        return super().extract_reasoning_streaming(previous_text, current_text, delta_text)

    def split(self, text: str, final: bool) -> ReasoningState:
        if not self.thinking:
            return ReasoningState(content=text, reasoning_ended=True)
        if START.startswith(text) and not final and text != START:
            return ReasoningState()  # may still become the opening tag
        start = len(START) if text.startswith(START) else 0
        end = self._find_end(text, start)
        if end >= 0:
            return ReasoningState(reasoning=text[start:end], content=text[end + len(END):],
                                  reasoning_ended=True)
        held = 0 if final else _partial_suffix(text, END)
        return ReasoningState(reasoning=text[start:len(text) - held])

    def _find_end(self, text: str, start: int) -> int:
        """``text.find(END, start)``; in a stream, from where the last search stopped (a stream
        of n pieces then costs O(n) searching instead of O(n^2))."""
        if not self._streamed:
            return text.find(END, start)
        if self._end < 0:
            self._end = text.find(END, max(start, self._searched))
            self._searched = max(0, len(text) - len(END) + 1)
        return self._end

    def marker_token_ids(self) -> frozenset[int]:
        return frozenset({self.start_token_id, self.end_token_id} - {None})

    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        if not self.thinking:
            return True
        for token in reversed(token_ids):
            if token == self.end_token_id:
                return True
            if token == self.start_token_id:
                return False
        return False

    def content_token_ids(self, token_ids: Sequence[int]) -> list[int]:
        if not self.thinking:
            return list(token_ids)
        ids = list(token_ids)
        for i in range(len(ids) - 1, -1, -1):
            if ids[i] == self.end_token_id:
                return ids[i + 1:]
            if ids[i] == self.start_token_id:
                break
        return []

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """The tokens between the output's first ``<think>`` (or its start, the template having
        opened the block) and its first ``</think>`` (or its end), tags excluded: vLLM's
        ``BaseThinkingReasoningParser.count_reasoning_tokens``."""
        if not self.thinking:
            return 0
        ids = list(token_ids)
        start = ids.index(self.start_token_id) + 1 if self.start_token_id in ids else 0
        end = ids.index(self.end_token_id) if self.end_token_id in ids else len(ids)
        return max(0, end - start)


@register_reasoning_parser("deepseek_r1")
class DeepSeekR1ReasoningParser(ThinkTagReasoningParser):
    """DeepSeek-R1 (and its distills): always reasons first."""


@register_reasoning_parser("qwen3")
class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """Qwen3: reasons unless ``enable_thinking`` is false."""

    honours_enable_thinking = True
