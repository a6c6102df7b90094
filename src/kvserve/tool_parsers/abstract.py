"""The tool-parser extension point: one interface, a registry, and split-invariant streaming.

A parser reads the model's text (detokenized with special tokens kept, so ``[TOOL_CALLS]``,
``<|python_tag|>`` and ``<tool_call>`` are visible) and returns OpenAI tool calls. It has two
uses, as vLLM's ``ToolParser``:

* :meth:`ToolParser.extract_tool_calls` on a whole output (non-streamed responses);
* :meth:`ToolParser.extract_tool_calls_streaming` on each new piece, then
  :meth:`ToolParser.finish_streaming` once at the end (streamed responses).

How streaming stays equal to the whole-text result, for every split of the text: each parser
implements one function of the text, :meth:`ToolParser.parse` -> :class:`ParseState`
(``content`` so far, each call's ``name`` and ``arguments`` text so far, and whether the text
stopped being a well-formed call). It is *monotone*: on a longer text, ``content`` and every
call's ``arguments`` only grow at their end, a call's ``name`` once known never changes, calls
are only appended. Everything uncertain is held back (a partial ``<tool_call`` tag, a name
whose string is not closed yet, characters after the first invalid JSON character). Streaming
emits the growth of that state, so the concatenated stream is the state of the whole text,
whatever the pieces; parsers read the text character by character with incremental state,
so the cost per piece is the piece's length.

Rules shared by all parsers:

* a call's name is sent (with ``id`` and ``type``) once it is complete and its arguments have
  started; then ``arguments`` is sent in pieces: the raw JSON text the model wrote (for
  ``pythonic``, the JSON of its Python literals). Non-streamed results carry the same text.
* Malformed or truncated calls: the whole-text result falls back to content (``tools_called``
  false, ``content`` the whole text, as vLLM, or what :meth:`ToolParser.content_without_calls`
  says for a format whose text is not all for the user); never an exception. A stream that had
  not sent a call yet sends the held text as content at :meth:`finish_streaming`, so it ends
  equal to the whole-text result; a stream that had already sent a call cannot take it back (it stays a call
  whose arguments stop at the last valid character; the lead may report an error for it).

Interface note for the lead (chat serving): with ``--enable-auto-tool-choice
--tool-call-parser NAME`` and ``tool_choice`` ``auto``, make one parser per choice
(``get_tool_parser(NAME)(tokenizer)``), detokenize with ``skip_special_tokens=False`` when
``needs_special_tokens``, feed every delta, call ``finish_streaming`` with the final text, and
set ``finish_reason: "tool_calls"`` when a call was made. Apply ``parallel_tool_calls: false``
with :func:`kvserve.tool_parsers.tool_choice.limit_tool_calls` / ``limit_tool_call_deltas``. A
parser that ``reads_whole_output`` (``openai``, harmony) gets the model's whole text, not the
reasoning parser's answer, and its content replaces the reasoning parser's.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvserve.registry import Registry
from kvserve.tool_parsers.types import (
    DeltaFunctionCall,
    DeltaToolCall,
    ExtractedToolCalls,
    FunctionCall,
    ToolCall,
    ToolCallDelta,
    make_tool_call_id,
)

logger = logging.getLogger(__name__)


@dataclass
class ParsedCall:
    """One call as far as the text shows it (``name`` is ``None`` until it may be sent)."""

    name: str | None = None
    arguments: str = ""
    complete: bool = False


@dataclass
class ParseState:
    """The parse of a text: see the module docstring for the monotonicity contract."""

    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    failed: bool = False


class ParseContext(ABC):
    """Incremental parse of one growing text (the text is only ever extended)."""

    @abstractmethod
    def feed(self, text: str) -> None:
        """Read the new end of ``text`` (everything after what was read before)."""

    @abstractmethod
    def state(self, final: bool) -> ParseState:
        """The parse so far; ``final`` releases what was held back for more text."""


class ToolParser(ABC):
    """Base of tool-call parsers (registered by name with :func:`register_tool_parser`).

    Args:
        tokenizer: the model's tokenizer (unused by the text-based parsers; kept for parsers
            that need token ids).
        id_factory: makes tool-call ids (default: vLLM's ``chatcmpl-tool-<hex>``).
    """

    name: str = ""
    needs_special_tokens: bool = True
    #: reads the model's whole text, reasoning included, instead of the reasoning parser's
    #: answer, and gives the content itself (harmony: the channels say what is content)
    reads_whole_output: bool = False

    def __init__(self, tokenizer: Any = None, *, id_factory: Callable[[], str] | None = None):
        self.tokenizer = tokenizer
        self.make_id = id_factory or self.default_id
        self._context: ParseContext | None = None
        self._text = ""
        self._sent_content = 0
        self._sent: list[tuple[str, int]] = []  # per sent call: (id, arguments sent)

    @staticmethod
    def default_id() -> str:
        return make_tool_call_id()

    @abstractmethod
    def new_context(self) -> ParseContext:
        """A fresh incremental parse."""

    def parse(self, text: str, final: bool = True) -> ParseState:
        """The parse of ``text`` (never raises: an internal error reads as malformed)."""
        context = self.new_context()
        return self._safe_state(context, text, final)

    @staticmethod
    def _safe_state(context: ParseContext, text: str, final: bool) -> ParseState:
        try:
            context.feed(text)
            return context.state(final)
        except Exception:  # a parser bug must not fail the request
            logger.exception("tool parser failed; treating the output as content")
            return ParseState(content="", failed=True)

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        """The tool calls of a whole output; malformed or truncated calls -> all content."""
        state = self.parse(text, final=True)
        if state.failed or not state.calls or not all(c.complete and c.name for c in state.calls):
            return ExtractedToolCalls(False, (), self.content_without_calls(state, text) or None)
        calls = tuple(ToolCall(id=self.make_id(), function=FunctionCall(c.name, c.arguments))
                      for c in state.calls)
        return ExtractedToolCalls(True, calls, state.content or None)

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str,
                                     delta_text: str) -> ToolCallDelta | None:
        """What ``delta_text`` adds (``current_text = previous_text + delta_text``), or ``None``."""
        if self._context is None or not current_text.startswith(self._text):
            self._restart()
        self._text = current_text
        state = self._safe_state(self._context, current_text, final=False)
        return self._emit(state, current_text)

    def finish_streaming(self, text: str) -> ToolCallDelta | None:
        """The last delta at the end of the output (``text`` is the whole output)."""
        if self._context is None or not text.startswith(self._text):
            self._restart()
        state = self._safe_state(self._context, text, final=True)
        self._text = text
        if not self._sent and (state.failed or not state.calls
                               or not all(c.complete and c.name for c in state.calls)):
            state = ParseState(content=self.content_without_calls(state, text))  # nothing sent as a call
        return self._emit(state, text)

    def content_without_calls(self, state: ParseState, text: str) -> str:
        """The content of a text read as holding no calls (none, or malformed ones): the whole
        text, as vLLM; a format whose text is not all for the user (harmony) says its own."""
        return text

    @property
    def tools_called(self) -> bool:
        """Whether the stream has sent at least one tool call."""
        return bool(self._sent)

    def _restart(self) -> None:
        self._context = self.new_context()
        self._text = ""

    def _emit(self, state: ParseState, text: str) -> ToolCallDelta | None:
        content = None
        if len(state.content) > self._sent_content:
            content = state.content[self._sent_content:]
            self._sent_content = len(state.content)
        deltas = []
        for index, call in enumerate(state.calls):
            delta = self._call_delta(index, call)
            if delta is False:
                break
            if delta is not None:
                deltas.append(delta)
        if content is None and not deltas:
            return None
        return ToolCallDelta(content=content, tool_calls=tuple(deltas))

    def _call_delta(self, index: int, call: ParsedCall):
        """The delta for call ``index``; ``False`` when it (and so later ones) cannot be sent."""
        if index >= len(self._sent):
            if call.name is None or index > len(self._sent):
                return False
            call_id = self.make_id()
            self._sent.append((call_id, len(call.arguments)))
            return DeltaToolCall(index=index, id=call_id, type="function",
                                 function=DeltaFunctionCall(name=call.name,
                                                            arguments=call.arguments))
        call_id, sent = self._sent[index]
        if len(call.arguments) <= sent:
            return None
        self._sent[index] = (call_id, len(call.arguments))
        return DeltaToolCall(index=index,
                             function=DeltaFunctionCall(arguments=call.arguments[sent:]))


_PARSERS: Registry[type[ToolParser]] = Registry("tool call parser", "kvserve.tool_parsers.parsers")
register_tool_parser = _PARSERS.register  # class decorator
get_tool_parser = _PARSERS.get  # by --tool-call-parser name; ValueError lists the names
tool_parser_names = _PARSERS.names
