"""One chat choice's output text read as OpenAI's message: ``reasoning``, ``content`` and
``tool_calls``, whole (non-streamed responses) or piece by piece (stream deltas).

The text goes through at most two parsers, in this order::

    model text ──► reasoning parser ──► reasoning            (--reasoning-parser)
                        │
                        └─ answer ──► tool parser ──► content, tool_calls
                                      (the --tool-call-parser for tool_choice "auto";
                                       ForcedToolCallParser for "required" / a named function)

A tool parser that ``reads_whole_output`` (``openai``: GPT-OSS's harmony channels say which
message is reasoning, content or a call) reads the model text itself instead of the answer, and
its content replaces the reasoning parser's; the reasoning parser then gives the reasoning only.

Both parsers are split-invariant (``kvserve.reasoning.abstract``, ``kvserve.tool_parsers.abstract``):
the answer a stream hands the tool parser is, concatenated, the whole answer, so a streamed choice
adds up to the non-streamed message for every split of the text into pieces. One exception is
the parsers' own: a stream that already sent a call cannot take it back when the text later
stops being a valid call (the whole-text result is then all content, as vLLM's).

``parallel_tool_calls: false`` keeps call 0 only (vLLM's ``maybe_filter_parallel_tool_calls``);
``include_reasoning: false`` drops the reasoning (vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.reasoning import ReasoningParser
from kvserve.tool_parsers import (DeltaToolCall, ToolCall, ToolParser, limit_tool_call_deltas,
                                  limit_tool_calls)


@dataclass(frozen=True)
class ParsedMessage:
    """A whole choice's message parts (``None``: the part is absent)."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class MessageDelta:
    """What one streamed piece adds to the message (a chunk's ``delta`` less its role)."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: tuple[DeltaToolCall, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return self.reasoning is not None or self.content is not None or bool(self.tool_calls)


class ChoiceOutput:
    """Reads one choice's text (see the module docstring); one instance per choice and response.

    Args:
        reasoning: a fresh reasoning parser, or None (the text is all answer).
        tools: a fresh tool parser, or None (the answer is all content).
        include_reasoning: False drops the reasoning from the message and the deltas.
        parallel_tool_calls: False keeps the first call only.
    """

    def __init__(self, reasoning: ReasoningParser | None = None, tools: ToolParser | None = None, *,
                 include_reasoning: bool = True, parallel_tool_calls: bool | None = True):
        self.reasoning = reasoning
        self.tools = tools
        self.include_reasoning = include_reasoning
        self.parallel_tool_calls = parallel_tool_calls
        self.text = ""  # what was fed so far (kept only when a parser reads it)
        self._answer = ""

    @property
    def parses(self) -> bool:
        """Whether any parser reads the text (otherwise it is passed through as content)."""
        return self.reasoning is not None or self.tools is not None

    @property
    def tools_called(self) -> bool:
        """Whether the stream has sent a tool call."""
        return self.tools is not None and self.tools.tools_called

    @property
    def _tools_read_whole_output(self) -> bool:
        return self.tools is not None and self.tools.reads_whole_output

    def parse(self, text: str) -> ParsedMessage:
        """The message of the whole ``text`` (malformed calls are content, as vLLM)."""
        reasoning, content = None, text
        if self.reasoning is not None:
            reasoning, content = self.reasoning.extract_reasoning(text)
        calls: tuple[ToolCall, ...] = ()
        if self.tools is not None:
            whole = self._tools_read_whole_output
            extracted = self.tools.extract_tool_calls(text if whole else (content or ""))
            if extracted.tools_called or whole:
                calls = limit_tool_calls(extracted.tool_calls, self.parallel_tool_calls)
                content = extracted.content
        if self.parses and not content:
            content = None
        return ParsedMessage(reasoning if self.include_reasoning else None, content, calls)

    def feed(self, piece: str, final: bool = False) -> MessageDelta | None:
        """What ``piece`` (the next text of the choice) adds; with ``final`` also everything held
        back for more text. Returns None when the piece adds nothing to send yet."""
        if not self.parses:
            return MessageDelta(content=piece) if piece else None
        previous, self.text = self.text, self.text + piece
        reasoning, answer = None, piece
        if self.reasoning is not None:
            if final:
                split = self.reasoning.finish_streaming(self.text)
            else:
                split = self.reasoning.extract_reasoning_streaming(previous, self.text, piece)
            reasoning, answer = (split.reasoning_content, split.content) if split else (None, None)
        if self._tools_read_whole_output:
            answer = piece  # the tool parser reads the model's text itself, and gives the content
        content, calls = self._answer_delta(answer or "", final)
        delta = MessageDelta(reasoning if self.include_reasoning else None, content, calls)
        return delta if delta else None

    def _answer_delta(self, answer: str, final: bool) -> tuple[str | None, tuple[DeltaToolCall, ...]]:
        if self.tools is None:
            return answer or None, ()
        previous, self._answer = self._answer, self._answer + answer
        if final:
            delta = self.tools.finish_streaming(self._answer)
        elif answer:
            delta = self.tools.extract_tool_calls_streaming(previous, self._answer, answer)
        else:
            delta = None
        delta = limit_tool_call_deltas(delta, self.parallel_tool_calls)
        if delta is None:
            return None, ()
        return delta.content or None, delta.tool_calls

