"""SSE event formatting."""

from __future__ import annotations

import json

from kvserve.api.responses import CompletionChoice, CompletionStreamResponse
from kvserve.api.sse import SSE_DONE, format_sse


def test_dict_event_is_compact_utf8_json():
    event = format_sse({"text": "你好 🙂\nnext", "n": None})
    assert event == 'data: {"text":"你好 🙂\\nnext","n":null}\n\n'
    assert event.count("\n") == 2  # newlines inside strings are escaped


def test_model_event_round_trips():
    chunk = CompletionStreamResponse(id="cmpl-1", created=5, model="m",
                                     choices=[CompletionChoice(index=0, text="hi")])
    event = format_sse(chunk)
    assert event.startswith("data: ") and event.endswith("\n\n")
    assert json.loads(event[len("data: "):]) == chunk.model_dump(mode="json")


def test_done_marker():
    assert SSE_DONE == "data: [DONE]\n\n"
