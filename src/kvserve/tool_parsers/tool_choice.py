"""``tool_choice`` other than ``auto``: validation, the forcing JSON schema, its output as calls.

Semantics of vLLM's chat protocol (``check_tool_usage``, ``get_json_schema_from_tools`` in
``vllm/tool_parsers/utils.py``, the chat serving's handling of forced calls):

* ``none`` (the default without tools): no calls; ``auto`` (the default with tools): the tool
  parser reads what the model writes; ``required``: constrained decoding to
  ``[{"name": <one of the tools>, "parameters": <its parameters schema>}, ...]`` (at least one);
  a named function ``{"type": "function", "function": {"name": N}}``: constrained decoding to
  N's ``parameters``, and the whole output is N's arguments.
* ``parallel_tool_calls: false`` keeps the first call (index 0) only, in whole responses and in
  stream deltas (vLLM's ``maybe_filter_parallel_tool_calls``).

Interface note for the lead: in the input processor call :func:`validate_tool_choice`, then
:func:`forced_tool_schema`; a schema means ``StructuredOutputsParams(json=schema,
source="tool_choice")`` (and no tool parser); answer with :class:`ForcedToolCallParser` (whole
and streamed, same split-invariance as the parsers) and ``finish_reason: "tool_calls"``.
Two kvserve choices differ from vLLM: a named function without ``parameters`` is forced to an
empty object (vLLM leaves it unconstrained), and ``required`` calls keep the model's argument
text (vLLM re-serialises it) so streamed and whole results are equal.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from kvserve.errors import InvalidRequestError
from kvserve.tool_parsers.abstract import ParseContext, ParsedCall, ParseState, ToolParser
from kvserve.tool_parsers.json_calls import CallArrayReader
from kvserve.tool_parsers.json_scan import JsonObjectScanner
from kvserve.tool_parsers.types import DeltaToolCall, ToolCall, ToolCallDelta

EMPTY_OBJECT_SCHEMA = {"type": "object", "properties": {}}
_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _function(tool: Any) -> Mapping:
    if hasattr(tool, "model_dump"):
        tool = tool.model_dump(exclude_none=True)
    function = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InvalidRequestError("each tool must be {\"type\": \"function\", \"function\": "
                                  "{\"name\", \"parameters\"?}}", param="tools")
    return function


def named_function(tool_choice: Any) -> str | None:
    """The forced function's name, or ``None`` for ``none``/``auto``/``required``."""
    if hasattr(tool_choice, "model_dump"):
        tool_choice = tool_choice.model_dump()
    if isinstance(tool_choice, Mapping):
        return (tool_choice.get("function") or {}).get("name")
    return None


def validate_tool_choice(tool_choice: Any, tools: Sequence[Any] | None,
                         structured_outputs: bool = False) -> str | dict:
    """The effective ``tool_choice`` (vLLM's defaults), or a 400 naming what is allowed.

    Args:
        tool_choice: the request's value (``None`` when absent).
        tools: the request's tools (``None`` when absent).
        structured_outputs: whether the request also has a structured-output constraint.

    Raises:
        InvalidRequestError: empty ``tools``; ``tool_choice`` without tools; an unknown value;
            a named function that is not among the tools; a named function together with a
            structured-output constraint.
    """
    if tools is not None and len(tools) == 0:
        raise InvalidRequestError("`tools` must not be an empty array. Either provide at least "
                                  "one tool or omit the field entirely.", param="tools")
    if tool_choice is None:
        return "auto" if tools else "none"
    if tool_choice == "none":
        return "none"
    if not tools:
        raise InvalidRequestError("When using `tool_choice`, `tools` must be set.",
                                  param="tool_choice")
    if tool_choice in ("auto", "required"):
        return tool_choice
    if not isinstance(tool_choice, Mapping) and not hasattr(tool_choice, "model_dump"):
        raise InvalidRequestError(f"Invalid value for `tool_choice`: {tool_choice!r}! Only named "
                                  'tools, "none", "auto" or "required" are supported.',
                                  param="tool_choice")
    name = named_function(tool_choice)
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"Invalid `name` in `function` in `tool_choice`! {_USAGE}",
                                  param="tool_choice.function.name")
    if name not in {_function(t)["name"] for t in tools}:
        raise InvalidRequestError("The tool specified in `tool_choice` does not match any of "
                                  "the specified `tools`", param="tool_choice")
    if structured_outputs:
        raise InvalidRequestError("You can only either use constraints for structured outputs "
                                  "or tools, not both.", param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def forced_tool_schema(tool_choice: Any, tools: Sequence[Any] | None) -> dict | None:
    """The JSON schema that forces a call (``None`` for ``none``/``auto``).

    ``required``: an array (``minItems`` 1) of objects, each ``anyOf`` one tool as
    ``{"name": {"enum": [N]}, "parameters": <N's parameters>}``; the tools' ``$defs`` are
    merged at the top (the same name with two schemas is a 400). A named function: its
    ``parameters``. The request's tools are not modified.
    """
    if tools is None or tool_choice in (None, "none", "auto"):
        return None
    name = named_function(tool_choice)
    functions = [_function(t) for t in tools]
    if name is not None:
        function = next(f for f in functions if f["name"] == name)
        return copy.deepcopy(function.get("parameters")) or dict(EMPTY_OBJECT_SCHEMA)
    items, defs = [], {}
    for function in functions:
        parameters = copy.deepcopy(function.get("parameters")) or dict(EMPTY_OBJECT_SCHEMA)
        for def_name, schema in parameters.pop("$defs", {}).items():
            if defs.setdefault(def_name, schema) != schema:
                raise InvalidRequestError(f"Tool definition '{def_name}' has multiple schemas, "
                                          "which is not supported.", param="tools")
        items.append({
            "properties": {"name": {"type": "string", "enum": [function["name"]]},
                           "parameters": parameters},
            "required": ["name", "parameters"],
        })
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": items}}
    if defs:
        schema["$defs"] = defs
    return schema


class _NamedContext(ParseContext):
    """The whole output is one JSON object: the arguments of the named function."""

    def __init__(self, name: str):
        self.name = name
        self.scanner = JsonObjectScanner(0)
        self.text = ""

    def feed(self, text: str) -> None:
        self.text = text
        self.scanner.feed(text)

    def state(self, final: bool) -> ParseState:
        scanner = self.scanner
        brace = len(self.text) - len(self.text.lstrip())
        if scanner.pos <= brace:
            return ParseState(failed=scanner.error)
        end = scanner.end if scanner.done else scanner.pos
        call = ParsedCall(self.name, self.text[brace:end], scanner.done)
        return ParseState(calls=[call], failed=scanner.error)


class _RequiredContext(ParseContext):
    def __init__(self):
        self.reader = CallArrayReader(0, argument_keys=("parameters",))

    def feed(self, text: str) -> None:
        self.reader.feed(text)

    def state(self, final: bool) -> ParseState:
        reader = self.reader
        failed = reader.failed or (final and not reader.done)
        return ParseState(calls=list(reader.calls), failed=failed)


class ForcedToolCallParser(ToolParser):
    """Reads the output forced by ``required`` or a named function (whole or streamed)."""

    needs_special_tokens = False

    def __init__(self, tool_choice: Any, tokenizer: Any = None, **kwargs: Any):
        super().__init__(tokenizer, **kwargs)
        self.function_name = named_function(tool_choice)

    def new_context(self) -> ParseContext:
        if self.function_name is not None:
            return _NamedContext(self.function_name)
        return _RequiredContext()


def limit_tool_calls(calls: Sequence[ToolCall], parallel_tool_calls: bool | None
                     ) -> tuple[ToolCall, ...]:
    """``parallel_tool_calls: false`` keeps the first call only."""
    return tuple(calls[:1]) if parallel_tool_calls is False else tuple(calls)


def limit_tool_call_deltas(delta: ToolCallDelta | None, parallel_tool_calls: bool | None
                           ) -> ToolCallDelta | None:
    """``parallel_tool_calls: false`` keeps the deltas of call index 0 only."""
    if delta is None or parallel_tool_calls is not False or not delta.tool_calls:
        return delta
    kept: tuple[DeltaToolCall, ...] = tuple(d for d in delta.tool_calls if d.index == 0)
    if not kept and delta.content is None:
        return None
    return ToolCallDelta(content=delta.content, tool_calls=kept)
