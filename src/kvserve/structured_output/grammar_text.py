"""Grammar text helpers shared by the backends: choice lists as EBNF, Lark-or-EBNF detection."""

from __future__ import annotations

import re
from collections.abc import Sequence

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_COMMENT = re.compile(r"(#|//).*$")


def ebnf_string_literal(text: str) -> str:
    """``text`` as a double-quoted EBNF/GBNF literal (backslash, quote and control characters
    escaped; other characters, any Unicode, kept as they are)."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_to_ebnf(choices: Sequence[str]) -> str:
    """``root ::= "a" | "b" ...``: the output is exactly one of ``choices``."""
    return "root ::= " + " | ".join(ebnf_string_literal(c) for c in choices)


def is_lark_grammar(grammar: str) -> bool:
    """Lark unless some line (comments removed) defines a rule with ``::=`` (EBNF/GBNF).

    The same rule as vLLM's ``grammar_is_likely_lark``.
    """
    for line in grammar.splitlines():
        if "::=" in _COMMENT.sub("", line):
            return False
    return True
