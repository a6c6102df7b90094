"""Shared pieces of the JSON tool-call parsers: a call from a scanned object, tag matching."""

from __future__ import annotations

import json

from kvserve.tool_parsers.abstract import ParsedCall
from kvserve.tool_parsers.json_scan import JsonObjectScanner


def call_from_object(scanner: JsonObjectScanner, text: str,
                     argument_keys: tuple[str, ...] = ("arguments",)) -> tuple[ParsedCall, bool]:
    """``(call, failed)`` for a ``{"name": ..., "arguments": {...}}`` object being scanned.

    The name is given once its string is complete and the arguments object has started; the
    arguments are the raw text of that object up to the last valid character. ``failed``: the
    JSON is invalid, a key is repeated, the name is not a string, the arguments are not an
    object, or the object ended without both.
    """
    call = ParsedCall()
    if scanner.error:
        return call, True
    name_member = scanner.member("name")
    args_member = next((m for key in argument_keys if (m := scanner.member(key)) is not None), None)
    if scanner.count("name") > 1 or sum(scanner.count(k) for k in argument_keys) > 1:
        return call, True
    if name_member is not None and name_member.value_start is not None:
        if text[name_member.value_start] != '"':
            return call, True
    args_started = args_member is not None and args_member.value_start is not None
    if args_started and text[args_member.value_start] != "{":
        return call, True
    if scanner.done and (name_member is None or args_member is None):
        return call, True
    if args_started and name_member is not None and name_member.value_end is not None:
        call.name = json.loads(text[name_member.value_start:name_member.value_end])
        end = args_member.value_end if args_member.value_end is not None else scanner.pos
        call.arguments = text[args_member.value_start:end]
        call.complete = scanner.done
    return call, False


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest proper prefix of ``tag`` that ``text`` ends with."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class CallArrayReader:
    """Reads ``[{"name": ..., <argument key>: {...}}, ...]`` starting at ``start`` (whitespace
    first allowed): Mistral's pre-v11 form and the output forced by ``tool_choice: required``.

    Attributes:
        calls: the calls so far; ``failed``: not such an array; ``done``: ``]`` was read.
    """

    def __init__(self, start: int, argument_keys: tuple[str, ...] = ("arguments",)):
        self.cursor = start
        self.keys = argument_keys
        self.opened = False
        self.scanner: JsonObjectScanner | None = None
        self.calls: list[ParsedCall] = []
        self.failed = False
        self.done = False

    def feed(self, text: str) -> None:
        while not self.failed and not self.done and self._step(text):
            pass

    def _step(self, text: str) -> bool:
        at = skip_whitespace(text, self.cursor)
        if at >= len(text):
            return False
        if not self.opened:
            self.opened, self.cursor, self.failed = True, at + 1, text[at] != "["
            return not self.failed
        if self.scanner is None or self.scanner.done:
            if self.scanner is not None:  # after an item: "," or "]"
                self.cursor = at + 1
                self.scanner = None if text[at] == "," else self.scanner
                self.done = text[at] == "]"
                self.failed = text[at] not in ",]"
                return text[at] == ","
            if text[at] == "]" and not self.calls:  # an empty list
                self.done = True
                return False
            self.scanner = JsonObjectScanner(at)
            self.calls.append(ParsedCall())
        self.scanner.feed(text)
        self.calls[-1], self.failed = call_from_object(self.scanner, text, self.keys)
        if self.failed or not self.scanner.done:
            return False
        self.cursor = self.scanner.end
        return True
