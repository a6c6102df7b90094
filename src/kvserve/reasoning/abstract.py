"""The reasoning-parser extension point: split ``<think>...</think>`` off the answer.

A reasoning parser turns a model's output text into ``reasoning_content`` (what the model wrote
while thinking) and ``content`` (the answer), whole (:meth:`ReasoningParser.extract_reasoning`)
and streamed (:meth:`ReasoningParser.extract_reasoning_streaming` on every piece, then
:meth:`ReasoningParser.finish_streaming`), and tells from token ids whether the reasoning has
ended (:meth:`ReasoningParser.is_reasoning_end`), so a grammar constrains only the answer.

Streaming is split-invariant by the same construction as the tool parsers (see
:mod:`kvserve.tool_parsers.abstract`): the parse of a text is monotone (reasoning and content
only grow at their end; a partial ``</think>`` at the end is held back until it resolves), and a
stream sends its growth, so the concatenated deltas equal the whole-text split for any pieces.

Interface notes for the lead:

* chat serving (``--reasoning-parser NAME``): one parser per choice, built with the request's
  ``chat_template_kwargs`` (``enable_thinking``); feed the detokenized text (special tokens kept
  when ``<think>`` is special); send ``reasoning_content`` deltas as is and pass ``content``
  deltas on to the tool parser, if any, as its text; the final message gets
  :meth:`extract_reasoning`'s pair. vLLM >= 0.10 names the field ``reasoning`` (and accepts
  ``reasoning_content`` on input); decide which to emit (both is what clients tolerate best).
* structured outputs: at admission ``is_reasoning_end(prompt_token_ids)`` (True when the template
  closed the think block, e.g. Qwen3 with ``enable_thinking: false``); while it is False, the
  request's rows get no bitmask and its tokens are not fed to the grammar; on the step where
  ``is_reasoning_end(output_token_ids)`` turns True, feed the grammar
  ``content_token_ids(output_token_ids)`` (the tokens after ``</think>``), then every token.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvserve.registry import Registry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReasoningDelta:
    """What one streamed piece adds to ``reasoning_content`` and to ``content``."""

    reasoning_content: str | None = None
    content: str | None = None


@dataclass
class ReasoningState:
    """The split of a text so far (monotone in the text, see the module docstring)."""

    reasoning: str = ""
    content: str = ""
    reasoning_ended: bool = False


class ReasoningParser(ABC):
    """Base of reasoning parsers (registered by name with :func:`register_reasoning_parser`).

    Args:
        tokenizer: the model's tokenizer (its vocabulary gives the think-tag token ids).
        chat_template_kwargs: the request's template arguments (``enable_thinking``).
    """

    name: str = ""

    def __init__(self, tokenizer: Any, *, chat_template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._sent_reasoning = 0
        self._sent_content = 0

    @abstractmethod
    def split(self, text: str, final: bool) -> ReasoningState:
        """The split of ``text``; ``final`` releases a partial tag held at the end."""

    @abstractmethod
    def is_reasoning_end(self, token_ids: Sequence[int]) -> bool:
        """Whether the reasoning is over after ``token_ids`` (a prompt, or prompt + output)."""

    @abstractmethod
    def content_token_ids(self, token_ids: Sequence[int]) -> list[int]:
        """The ids after the end of the reasoning (``[]`` while it has not ended)."""

    def marker_token_ids(self) -> frozenset[int]:
        """The ids of the tokens that mark the reasoning off (``<think>``, ``</think>``; harmony's
        markers). When one is a special token of the model, the chat text keeps special tokens so
        that this parser sees it (``ChatPlan.sampling_params``)."""
        return frozenset()

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """How many of an output's tokens are reasoning (``usage.completion_tokens_details.
        reasoning_tokens``); 0 unless a parser knows."""
        return 0

    def extract_reasoning(self, text: str) -> tuple[str | None, str | None]:
        """``(reasoning_content, content)`` of a whole output; an empty part is ``None``."""
        state = self._safe_split(text, final=True)
        return state.reasoning or None, state.content or None

    def extract_reasoning_streaming(self, previous_text: str, current_text: str,
                                    delta_text: str) -> ReasoningDelta | None:
        """What ``delta_text`` adds (``current_text = previous_text + delta_text``), or None."""
        return self._emit(self._safe_split(current_text, final=False))

    def finish_streaming(self, text: str) -> ReasoningDelta | None:
        """The last delta at the end of the output (``text`` is the whole output)."""
        return self._emit(self._safe_split(text, final=True))

    def _safe_split(self, text: str, final: bool) -> ReasoningState:
        try:
            return self.split(text, final)
        except Exception:  # a parser bug must not fail the request
            logger.exception("reasoning parser failed; treating the output as content")
            return ReasoningState(content=text if final else "")

    def _emit(self, state: ReasoningState) -> ReasoningDelta | None:
        reasoning = state.reasoning[self._sent_reasoning:] or None
        content = state.content[self._sent_content:] or None
        self._sent_reasoning = max(self._sent_reasoning, len(state.reasoning))
        self._sent_content = max(self._sent_content, len(state.content))
        if reasoning is None and content is None:
            return None
        return ReasoningDelta(reasoning_content=reasoning, content=content)


def vocabulary_token_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` as one vocabulary entry, or None (an unknown token maps to the unknown
    id, whose text differs). Per request this is two lookups; ``get_vocab()`` copies the whole
    vocabulary (about 200 ms for Tekken's 131,072 tokens)."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or tokenizer.convert_ids_to_tokens(token_id) != token:
        return None
    return token_id


_PARSERS: Registry[type[ReasoningParser]] = Registry("reasoning parser", "kvserve.reasoning.parsers")
register_reasoning_parser = _PARSERS.register  # class decorator
get_reasoning_parser = _PARSERS.get  # by --reasoning-parser name; ValueError lists the names
reasoning_parser_names = _PARSERS.names
