"""``pythonic``: a Python list of calls with keyword arguments (Llama 3.2 / Llama 4 style).

Llama 3.2's model card prompt asks for ``[func_name1(params_name1=params_value1,
params_name2=params_value2...), func_name2(params)]`` and no other text; vLLM's
``PythonicToolParser`` reads that when the output starts with ``[``. Argument values are Python
literals (strings, numbers, ``True``/``False``/``None``, lists, tuples, dicts; also JSON's
``true``/``false``/``null``, as newer vLLM accepts) and become the call's ``arguments`` as
``json.dumps({name: value, ...}, ensure_ascii=False)``. Each ``name=value`` pair is sent once
its value is complete; a positional argument, a repeated keyword or a non-literal value makes
the output malformed (content). Text after the closing ``]`` is dropped.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from kvserve.tool_parsers.abstract import (
    ParseContext,
    ParsedCall,
    ParseState,
    ToolParser,
    register_tool_parser,
)

_JSON_NAMES = {"true": True, "false": False, "null": None}
_OPEN = {"(": ")", "[": "]", "{": "}"}


def literal_to_json(node: ast.expr) -> Any:
    """The JSON value of a Python literal expression.

    Raises:
        ValueError: anything but a literal (names other than true/false/null, calls, ...).
    """
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, bool, int, float)):
            return node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = literal_to_json(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, (ast.List, ast.Tuple)):
        return [literal_to_json(item) for item in node.elts]
    elif isinstance(node, ast.Dict):
        if all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
            return {k.value: literal_to_json(v) for k, v in zip(node.keys, node.values)}
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def _json_pair(key: str, value_text: str) -> str:
    value = literal_to_json(ast.parse(value_text.strip(), mode="eval").body)
    return (json.dumps(key, ensure_ascii=False) + ": "
            + json.dumps(value, ensure_ascii=False, allow_nan=False))


class PythonicContext(ParseContext):
    """A character-level reader of ``[f(a=1, b="x"), g()]``."""

    def __init__(self):
        self.text = ""
        self.pos = 0
        self.mode: str | None = None
        self.phase = "open"
        self.start = 0  # of the current name, keyword or value
        self.keyword = ""
        self.keys: set[str] = set()
        self.stack: list[str] = []
        self.quote: str | None = None
        self.escape = False
        self.calls: list[ParsedCall] = []
        self.failed = False

    def feed(self, text: str) -> None:
        self.text = text
        if self.mode is None:
            rest = text.lstrip()
            if not rest:
                return
            self.mode = "calls" if rest[0] == "[" else "content"
            self.pos = len(text) - len(rest)
        while self.mode == "calls" and not self.failed and self.phase != "done" \
                and self.pos < len(text):
            if not self._step(text[self.pos]):
                self.failed = True
                return
            self.pos += 1

    def _step(self, ch: str) -> bool:
        phase = self.phase
        if phase == "value":
            return self._value_char(ch)
        identifier = ch.isalnum() or ch == "_" or (ch == "." and phase == "name")
        if phase in ("name", "keyword") and identifier:
            return True
        if phase == "name":
            return ch == "(" and self._open_call()
        if phase == "keyword":
            self.keyword = self.text[self.start:self.pos]
            self.phase = "equals"
        if ch.isspace():
            return True
        return self._token(ch)

    def _token(self, ch: str) -> bool:
        phase = self.phase
        if phase == "open":
            self.phase = "first_call"
            return ch == "["
        if phase in ("first_call", "next_call"):
            if ch == "]" and phase == "first_call":
                self.phase = "done"
                return True
            return self._begin(ch, "name")
        if phase == "keyword_or_close":
            if ch == ")":
                return self._close_call()
            return self._begin(ch, "keyword")
        if phase == "equals":
            if ch != "=" or self.keyword in self.keys:
                return False
            self.keys.add(self.keyword)
            self.phase, self.start = "value", self.pos + 1
            return True
        if phase == "after_call":
            if ch == "]":
                self.phase = "done"
                return True
            if ch == ",":
                self.phase = "next_call"
                return True
        return False

    def _begin(self, ch: str, phase: str) -> bool:
        if not (ch.isalpha() or ch == "_"):
            return False
        self.phase, self.start = phase, self.pos
        return True

    def _open_call(self) -> bool:
        self.calls.append(ParsedCall(name=self.text[self.start:self.pos], arguments="{"))
        self.keys = set()
        self.phase = "keyword_or_close"
        return True

    def _close_call(self) -> bool:
        call = self.calls[-1]
        call.arguments += "}"
        call.complete = True
        self.phase = "after_call"
        return True

    def _value_char(self, ch: str) -> bool:
        if self.quote is not None:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == self.quote:
                self.quote = None
            return True
        if ch in "'\"":
            self.quote = ch
        elif ch in _OPEN:
            self.stack.append(_OPEN[ch])
        elif self.stack:
            if ch in ")]}":
                return ch == self.stack.pop()
        elif ch in ",)":
            return self._end_value(closes_call=ch == ")")
        elif ch in "]}":
            return False
        return True

    def _end_value(self, closes_call: bool) -> bool:
        try:
            pair = _json_pair(self.keyword, self.text[self.start:self.pos])
        except (SyntaxError, ValueError, RecursionError):
            return False
        call = self.calls[-1]
        call.arguments += pair if call.arguments == "{" else ", " + pair
        if closes_call:
            return self._close_call()
        self.phase = "keyword_or_close"
        return True

    def state(self, final: bool) -> ParseState:
        if self.mode == "content" or (self.mode is None and final):
            return ParseState(content=self.text)
        calls = [ParsedCall(c.name, c.arguments, c.complete) for c in self.calls]
        return ParseState(calls=calls, failed=self.failed)


@register_tool_parser("pythonic")
class PythonicToolParser(ToolParser):
    """Python-list tool calls (see the module docstring)."""

    needs_special_tokens = False

    def new_context(self) -> PythonicContext:
        return PythonicContext()
