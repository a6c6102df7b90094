"""Running a reasoning parser over an output fed in pieces, as the server streams it (shared by
the parser tests)."""

from __future__ import annotations


def stream(parser, pieces):
    text, reasoning, content = "", "", ""
    deltas = []
    for piece in pieces:
        previous, text = text, text + piece
        deltas.append(parser.extract_reasoning_streaming(previous, text, piece))
    deltas.append(parser.finish_streaming(text))
    for delta in deltas:
        if delta is not None:
            reasoning += delta.reasoning_content or ""
            content += delta.content or ""
    return reasoning, content
