"""``llama3_json``: JSON calls of Llama 3.1/3.2/3.3 (and 4) instruct models.

Llama 3.1's model card and chat template ask for ``{"name": function name, "parameters":
dictionary of argument name and its value}``; the model may put ``<|python_tag|>`` first, and
several calls are separated by ``;`` (vLLM's ``Llama3JsonToolParser``). A call is recognised
only when the output starts with the tag or ``{`` (after whitespace), as vLLM's streaming path
decides; ``"arguments"`` is accepted in place of ``"parameters"``. Text after the last call is
dropped; when the output is a call list there is no content.
"""

from __future__ import annotations

from kvserve.tool_parsers.abstract import (
    ParseContext,
    ParsedCall,
    ParseState,
    ToolParser,
    register_tool_parser,
)
from kvserve.tool_parsers.json_calls import call_from_object, skip_whitespace
from kvserve.tool_parsers.json_scan import JsonObjectScanner

PYTHON_TAG = "<|python_tag|>"
ARGUMENT_KEYS = ("parameters", "arguments")


class Llama3JsonContext(ParseContext):
    def __init__(self):
        self.text = ""
        self.mode: str | None = None  # None: undecided, "content", "calls"
        self.scanners: list[JsonObjectScanner] = []
        self.calls: list[ParsedCall] = []
        self.failed = False
        self.stopped = False  # text after the last call: ignored

    def feed(self, text: str) -> None:
        self.text = text
        if self.mode is None:
            self._decide()
        while self.mode == "calls" and not self.failed and not self.stopped:
            scanner = self.scanners[-1]
            scanner.feed(text)
            call, self.failed = call_from_object(scanner, text, ARGUMENT_KEYS)
            self.calls[-1] = call
            if self.failed or not scanner.done:
                return
            after = skip_whitespace(text, scanner.end)
            if after >= len(text):
                return
            if text[after] != ";":
                self.stopped = True
                return
            self._add_scanner(after + 1)

    def _decide(self) -> None:
        start = skip_whitespace(self.text, 0)
        rest = self.text[start:]
        if not rest or (PYTHON_TAG.startswith(rest) and rest != PYTHON_TAG):
            return
        if rest.startswith(PYTHON_TAG):
            self._add_scanner(start + len(PYTHON_TAG))
        elif rest[0] == "{":
            self._add_scanner(start)
        else:
            self.mode = "content"
            return
        self.mode = "calls"

    def _add_scanner(self, start: int) -> None:
        self.scanners.append(JsonObjectScanner(start))
        self.calls.append(ParsedCall())

    def state(self, final: bool) -> ParseState:
        if self.mode == "content" or (self.mode is None and final):
            return ParseState(content=self.text)
        return ParseState(calls=list(self.calls), failed=self.failed)


@register_tool_parser("llama3_json")
class Llama3JsonToolParser(ToolParser):
    """Llama 3.x JSON tool calls (see the module docstring)."""

    def new_context(self) -> Llama3JsonContext:
        return Llama3JsonContext()
