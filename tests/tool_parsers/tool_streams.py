"""Running a tool parser over an output fed in pieces, as the server streams it (shared by the
parser tests)."""

from __future__ import annotations


def stream(parser, pieces):
    """Feed ``pieces`` and finish; returns (content, [(name, arguments)], deltas)."""
    text, content, calls, deltas = "", "", {}, []
    for piece in pieces:
        previous, text = text, text + piece
        deltas.append(parser.extract_tool_calls_streaming(previous, text, piece))
    deltas.append(parser.finish_streaming(text))
    for delta in deltas:
        if delta is None:
            continue
        content += delta.content or ""
        for call in delta.tool_calls:
            entry = calls.setdefault(call.index, {"id": call.id, "type": call.type,
                                                  "name": None, "arguments": ""})
            if call.function.name is not None:
                assert entry["name"] is None, "a name is sent once"
                entry["name"] = call.function.name
            entry["arguments"] += call.function.arguments or ""
    assert sorted(calls) == list(range(len(calls)))
    return content, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], deltas, calls
