"""An incremental, strict JSON object scanner that reports where its members are.

Tool-call parsers need more than ``json.loads``: while a call streams in, they must know whether
the text so far can still become valid JSON, whether the ``"name"`` string is complete, and
where the ``"arguments"`` value starts and (once it does) ends, so that they can stream the raw
argument text and nothing past the first invalid character. :class:`JsonObjectScanner` reads a
growing text character by character (RFC 8259 grammar: strings with escapes and ``\\uXXXX``,
numbers, ``true``/``false``/``null``, nesting) and keeps, for the members of the top-level
object, the spans of their keys and values. Feeding the text in any pieces gives the same state
as feeding it at once, which is what makes streamed tool calls split-invariant.

::

    text:   ...{"name": "get_weather", "arguments": {"city": "Paris"}}...
               ^start  ^key  ^value_start       ^value_start         ^end (after "}")
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_WS = " \t\n\r"
_ESCAPES = '"\\/bfnrtu'
_HEX = "0123456789abcdefABCDEF"
_LITERALS = {"t": "true", "f": "false", "n": "null"}
# Number DFA: state -> {character class -> next state}; accepting states end a number.
_NUMBER = {
    "minus": {"0": "zero", "d": "int"},
    "zero": {".": "dot", "e": "exp"},
    "int": {"0": "int", "d": "int", ".": "dot", "e": "exp"},
    "dot": {"0": "frac", "d": "frac"},
    "frac": {"0": "frac", "d": "frac", "e": "exp"},
    "exp": {"+": "exp_sign", "-": "exp_sign", "0": "exp_digits", "d": "exp_digits"},
    "exp_sign": {"0": "exp_digits", "d": "exp_digits"},
    "exp_digits": {"0": "exp_digits", "d": "exp_digits"},
}
_NUMBER_END = {"zero", "int", "frac", "exp_digits"}


def _number_class(ch: str) -> str:
    if ch == "0":
        return "0"
    if "1" <= ch <= "9":
        return "d"
    return "e" if ch in "eE" else ch


@dataclass
class Member:
    """One member of the top-level object: text positions (absolute indices into the text).

    ``key`` is set once the key string is complete; ``value_end`` once the value is complete.
    """

    key_start: int
    key: str | None = None
    value_start: int | None = None
    value_end: int | None = None


class JsonObjectScanner:
    """Scans one JSON object starting at ``start`` (leading whitespace allowed).

    Attributes:
        pos: index of the next character to read.
        done: the object is complete; ``end`` is the index after its ``}``.
        error: the text stopped being valid JSON at ``pos`` (nothing past it was read).
        members: the top-level members seen so far, in order.
    """

    def __init__(self, start: int):
        self.pos = start
        self.done = False
        self.error = False
        self.end: int | None = None
        self.members: list[Member] = []
        self._stack: list[str] = []
        self._state = "start"
        self._sub = ""  # number state, remaining literal text, or hex digits left
        self._is_key = False
        self._source = ""

    def feed(self, text: str) -> None:
        """Read ``text[self.pos:]`` (``text`` is the whole text so far, only ever extended)."""
        self._source = text
        while not self.done and not self.error and self.pos < len(text):
            if not self._step(text[self.pos]):
                self.error = True
                return
            self.pos += 1

    def member(self, key: str) -> Member | None:
        """The first complete-keyed member named ``key``."""
        return next((m for m in self.members if m.key == key), None)

    def count(self, key: str) -> int:
        return sum(1 for m in self.members if m.key == key)

    # -- the state machine: one character; False means invalid JSON -----------------------

    def _step(self, ch: str) -> bool:
        state = self._state
        if state == "string":
            return self._in_string(ch)
        if state == "escape":
            return self._in_escape(ch)
        if state == "unicode":
            if ch not in _HEX:
                return False
            self._sub = self._sub[1:]
            if not self._sub:
                self._state = "string"
            return True
        if state == "number":
            nxt = _NUMBER[self._sub].get(_number_class(ch))
            if nxt is not None:
                self._sub = nxt
                return True
            if self._sub not in _NUMBER_END:
                return False
            self._end_value()
            return self._step(ch)  # the delimiter belongs to the next state
        if state == "literal":
            if ch != self._sub[0]:
                return False
            self._sub = self._sub[1:]
            if not self._sub:
                self._end_value()
                self._value_end_at(self.pos + 1)
            return True
        if ch in _WS:
            return True
        return self._structural(ch, state)

    def _structural(self, ch: str, state: str) -> bool:
        if state == "start":
            if ch != "{":
                return False
            self._stack.append("{")
            self._state = "key_or_close"
            return True
        if state in ("key_or_close", "key"):
            if ch == "}" and state == "key_or_close":
                return self._close("{")
            if ch != '"':
                return False
            if len(self._stack) == 1:
                self.members.append(Member(key_start=self.pos))
            self._is_key = True
            self._state = "string"
            return True
        if state == "colon":
            if ch != ":":
                return False
            self._state = "value"
            return True
        if state in ("value", "value_or_close"):
            if ch == "]" and state == "value_or_close":
                return self._close("[")
            return self._start_value(ch)
        if state == "after_value":
            top = self._stack[-1]
            if ch == ",":
                self._state = "key" if top == "{" else "value"
                return True
            if (ch == "}" and top == "{") or (ch == "]" and top == "["):
                return self._close(top)
        return False

    def _start_value(self, ch: str) -> bool:
        if len(self._stack) == 1 and self.members:
            self.members[-1].value_start = self.pos
        if ch == '"':
            self._is_key = False
            self._state = "string"
        elif ch == "{":
            self._stack.append("{")
            self._state = "key_or_close"
        elif ch == "[":
            self._stack.append("[")
            self._state = "value_or_close"
        elif ch == "-" or "0" <= ch <= "9":
            self._state = "number"
            self._sub = "minus" if ch == "-" else ("zero" if ch == "0" else "int")
        elif ch in _LITERALS:
            self._state = "literal"
            self._sub = _LITERALS[ch][1:]
        else:
            return False
        return True

    def _in_string(self, ch: str) -> bool:
        if ch == "\\":
            self._state = "escape"
            return True
        if ord(ch) < 0x20:
            return False
        if ch != '"':
            return True
        if self._is_key:
            if len(self._stack) == 1:
                member = self.members[-1]
                member.key = json.loads(self._text_slice(member.key_start))
            self._state = "colon"
        else:
            self._end_value()
            self._value_end_at(self.pos + 1)
        return True

    def _in_escape(self, ch: str) -> bool:
        if ch not in _ESCAPES:
            return False
        if ch == "u":
            self._state = "unicode"
            self._sub = "xxxx"
        else:
            self._state = "string"
        return True

    def _close(self, bracket: str) -> bool:
        self._stack.pop()
        if not self._stack:
            self.done = True
            self.end = self.pos + 1
            return True
        self._end_value()
        self._value_end_at(self.pos + 1)
        return True

    def _end_value(self) -> None:
        self._state = "after_value"
        if len(self._stack) == 1 and self.members and self.members[-1].value_end is None:
            self.members[-1].value_end = self.pos  # numbers end before their delimiter

    def _value_end_at(self, end: int) -> None:
        if len(self._stack) == 1 and self.members:
            self.members[-1].value_end = end

    def _text_slice(self, start: int) -> str:
        return self._source[start: self.pos + 1]
