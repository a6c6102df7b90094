"""The ``openai`` tool parser on GPT-OSS outputs written from OpenAI's harmony guide: calls with
``to=`` after or before the channel, with ``<|constrain|>json`` or a bare content type, on the
commentary or analysis channel, a preamble, several calls, and broken or cut-off outputs (never an
exception; the content is what the channels say is content, never the analysis). Whole results
against json.loads of the written arguments; streams cut at every split point (markers cut in
two), at random splits and token by token through the engine's detokenizer must add up to them,
with OpenAI's delta shapes (id, type and name once, first)."""

from __future__ import annotations

import json
import random
import re

import pytest
import tool_streams

from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.testing.harmony_tokenizer import build_harmony_tokenizer
from kvserve.tool_parsers import get_tool_parser

ID = re.compile(r"^chatcmpl-tool-[0-9a-f]{32}$")
WEATHER = {"location": "Paris, 東京", "unit": "celsius", "note": 'say "hi" 😀'}
THINK = "<|channel|>analysis<|message|>The user wants the weather. Call get_weather.<|end|><|start|>assistant"

# (output as the engine returns it: a finishing <|call|> / <|return|> is left out), content, calls
CASES = [
    (THINK + "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     + json.dumps(WEATHER, ensure_ascii=False), None, [("get_weather", WEATHER)]),
    (" to=functions.get_weather<|channel|>commentary json<|message|>" + json.dumps(WEATHER),  # to= first
     None, [("get_weather", WEATHER)]),
    (THINK + "<|channel|>commentary<|message|>Let me check both.<|end|>"  # a preamble, then two calls
     "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     + json.dumps(WEATHER) + "<|call|><|start|>assistant to=functions.get_time<|channel|>commentary json"
     '<|message|>{"tz": "UTC"}<|call|>',
     "Let me check both.", [("get_weather", WEATHER), ("get_time", {"tz": "UTC"})]),
    ("<|channel|>analysis to=functions.lookup<|message|>{}", None, [("lookup", {})]),  # on analysis
    (THINK + "<|channel|>commentary to=functions.ping<|message|>{}<|call|>"
     "<|start|>assistant<|channel|>final<|message|>Pong.", "Pong.", [("ping", {})]),
]

NO_CALLS = [  # (output, content)
    (THINK + "<|channel|>final<|message|>It is sunny.", "It is sunny."),
    ("<|channel|>analysis<|message|>only thinking, cut off", ""),
    ("<|channel|>commentary to=browser.search<|message|>{\"q\": 1}<|call|>", ""),  # a built-in tool: dropped
    ("<|channel|>commentary to=functions.<|message|>{}", ""),  # no function name
    ("No harmony at all.", "No harmony at all."),
    (THINK + "<|channel|>final<|message|>Half a marker at the end <|cal", "Half a marker at the end <|cal"),
]

MALFORMED = [  # (output, content, calls): best effort, never an exception
    (THINK + "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\": \"Par",
     None, [("get_weather", '{"location": "Par')]),  # cut by max_tokens: the arguments so far
    (THINK + "<|channel|>commentary to=functions.f<|message|>not json<|call|>", None, [("f", "not json")]),
    ("<|channel|>commentary to=functions.f<|message|>{}<|channel|>final<|message|>no end marker", "no end marker",
     [("f", "{}")]),
    ("<|end|>junk<|message|><|constrain|>x<|start|>assistant<|channel|>commentary to=functions.g<|message|>{}",
     "x", [("g", "{}")]),  # a message without a header is content
]


def stream(parser, pieces):
    """Feed ``pieces`` and finish; returns (content or None, [(name, arguments)], deltas)."""
    content, calls, deltas, _ = tool_streams.stream(parser, pieces)
    return content or None, calls, deltas

def whole(text):
    result = get_tool_parser("openai")().extract_tool_calls(text)
    return result.content, [(c.function.name, c.function.arguments) for c in result.tool_calls], result


def random_pieces(text, rng):
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def assert_streams_equal_whole(text):
    expected = whole(text)[:2]
    for cut in range(len(text) + 1):
        assert stream(get_tool_parser("openai")(), [text[:cut], text[cut:]])[:2] == expected, cut
    for seed in range(60):
        pieces = random_pieces(text, random.Random(seed))
        assert stream(get_tool_parser("openai")(), pieces)[:2] == expected, pieces
    assert stream(get_tool_parser("openai")(), list(text))[:2] == expected


@pytest.mark.parametrize("text,content,calls", CASES)
def test_whole_text_against_json(text, content, calls):
    got_content, got_calls, result = whole(text)
    assert result.tools_called and got_content == content
    assert [(name, json.loads(arguments)) for name, arguments in got_calls] == calls
    ids = [c.id for c in result.tool_calls]
    assert all(ID.match(i) for i in ids) and len(set(ids)) == len(ids)


def test_arguments_are_the_body_as_written():
    assert whole(CASES[0][0])[1] == [("get_weather", json.dumps(WEATHER, ensure_ascii=False))]
    assert whole(THINK + "<|channel|>commentary to=functions.f<|message|> {\n \"a\" :1}")[1] == [("f", ' {\n "a" :1}')]


@pytest.mark.parametrize("text,content,calls", CASES)
def test_every_split_streams_the_whole_result(text, content, calls):
    assert_streams_equal_whole(text)


@pytest.mark.parametrize("text,content", NO_CALLS)
def test_no_calls_leave_the_content_the_channels_say(text, content):
    got_content, calls, result = whole(text)
    assert not result.tools_called and calls == [] and (got_content or "") == content
    assert_streams_equal_whole(text)


@pytest.mark.parametrize("text,content,calls", MALFORMED)
def test_broken_output_is_read_best_effort(text, content, calls):
    got_content, got_calls, result = whole(text)
    assert (got_content, got_calls) == (content, calls) and result.tools_called
    assert_streams_equal_whole(text)


def test_delta_shapes_follow_openai():
    _, calls, deltas = stream(get_tool_parser("openai")(), list(CASES[2][0]))
    first = {}
    for delta in deltas:
        for call in delta.tool_calls if delta else ():
            if call.index not in first:
                first[call.index] = call
                assert ID.match(call.id) and call.type == "function"
                assert set(call.to_dict()) == {"index", "id", "type", "function"}
            else:
                assert call.id is None and call.type is None and call.function.name is None
                assert set(call.to_dict()) == {"index", "function"} and call.function.arguments
    assert [first[i].function.name for i in sorted(first)] == ["get_weather", "get_time"]
    assert calls == [("get_weather", json.dumps(WEATHER)), ("get_time", '{"tz": "UTC"}')]


def test_token_by_token_through_the_detokenizer():
    tokenizer = build_harmony_tokenizer()
    for text, _, _ in CASES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
        pieces = [detokenizer.add_tokens([t]) for t in ids] + [detokenizer.flush()]
        assert "".join(pieces) == text
        assert stream(get_tool_parser("openai")(tokenizer), pieces)[:2] == whole(text)[:2]


def test_the_parser_reads_the_whole_output_and_keeps_special_tokens():
    parser = get_tool_parser("openai")
    assert parser.reads_whole_output and parser.needs_special_tokens
