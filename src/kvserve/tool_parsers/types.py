"""Tool-call results in OpenAI's shapes (``tool_calls`` of a message, and of a stream delta).

``to_dict()`` gives the JSON of the chat-completions API reference: a message's
``{"id", "type": "function", "function": {"name", "arguments"}}`` and a chunk's
``{"index", "id"?, "type"?, "function": {"name"?, "arguments"?}}`` (fields that are ``None``
left out). ``arguments`` is always a JSON text, as OpenAI sends it.

Ids follow vLLM: ``chatcmpl-tool-<32 hex>`` (``make_tool_call_id`` in vLLM's ``chat_utils``)
and, for Mistral models, 9 random ASCII letters/digits (``MistralToolCall``; mistral_common
requires ids of that shape in later turns).
"""

from __future__ import annotations

import random
import string
import uuid
from dataclasses import dataclass, field
from typing import Any


def make_tool_call_id() -> str:
    """vLLM's default tool-call id: ``chatcmpl-tool-`` and a random UUID4 in hex."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


_ALPHANUMERIC = string.ascii_letters + string.digits
_RNG = random.SystemRandom()


def make_mistral_tool_call_id() -> str:
    """A Mistral tool-call id: 9 random ASCII letters and digits."""
    return "".join(_RNG.choice(_ALPHANUMERIC) for _ in range(9))


@dataclass(frozen=True)
class FunctionCall:
    """``function`` of a tool call: the name and the arguments as JSON text."""

    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ToolCall:
    """One entry of a message's ``tool_calls``."""

    id: str
    function: FunctionCall
    type: str = "function"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "function": self.function.to_dict()}


@dataclass(frozen=True)
class DeltaFunctionCall:
    """``function`` of a streamed tool-call delta: the name once, then argument pieces."""

    name: str | None = None
    arguments: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("name", self.name), ("arguments", self.arguments))
                if v is not None}


@dataclass(frozen=True)
class DeltaToolCall:
    """One entry of a chunk's ``delta.tool_calls``; the first for an index carries id and type."""

    index: int
    id: str | None = None
    type: str | None = None
    function: DeltaFunctionCall | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"] = self.id
        if self.type is not None:
            out["type"] = self.type
        if self.function is not None:
            out["function"] = self.function.to_dict()
        return out


@dataclass(frozen=True)
class ToolCallDelta:
    """What one streamed piece of model text adds: ``content`` and/or tool-call deltas."""

    content: str | None = None
    tool_calls: tuple[DeltaToolCall, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.content is not None:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return out


@dataclass(frozen=True)
class ExtractedToolCalls:
    """The tool calls of a whole output (vLLM's ``ExtractedToolCallInformation``).

    Attributes:
        tools_called: at least one well-formed call was found.
        tool_calls: the calls, in order.
        content: the text that is not a call (``None`` when there is none).
    """

    tools_called: bool
    tool_calls: tuple[ToolCall, ...]
    content: str | None
