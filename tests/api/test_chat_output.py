"""A chat choice's text read as OpenAI's message (kvserve.api.chat_output): reasoning, then tool
calls, on texts written from the documented formats (Qwen3's <think> block, Qwen2.5/Hermes
<tool_call> JSON, the JSON forced by tool_choice required / a named function). Whole results are
checked against json.loads of the written values; streams cut at every split point, at random
multi-piece splits and token by token must add up to the whole result."""

from __future__ import annotations

import json
import random

import pytest

from kvserve.api.chat_output import ChoiceOutput
from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.reasoning import get_reasoning_parser
from kvserve.testing.tool_checkpoint import build_tool_tokenizer
from kvserve.tool_parsers import ForcedToolCallParser, get_tool_parser

NAMED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER = {"city": "Paris", "days": 3, "units": "°C 😀"}
THINK = "\nThe user wants the weather. I'll call get_weather.\n"

# (reasoning parser, tool choice: "auto" = hermes, "required", NAMED or None, text,
#  reasoning, content, [(name, arguments)])
CASES = [
    ("qwen3", "auto", f"<think>{THINK}</think>\n\n<tool_call>\n" + json.dumps(
        {"name": "get_weather", "arguments": WEATHER}, ensure_ascii=False) + "\n</tool_call>",
     THINK, "\n\n", [("get_weather", WEATHER)]),
    ("qwen3", "auto", f"{THINK}</think>Two calls.<tool_call>\n" + json.dumps(
        {"name": "get_weather", "arguments": WEATHER}) + "\n</tool_call>\n<tool_call>\n"
     '{"name": "get_time", "arguments": {}}\n</tool_call>',
     THINK, "Two calls.", [("get_weather", WEATHER), ("get_time", {})]),
    ("qwen3", "auto", "<think>short</think>Just text, no <tool_call", "short", "Just text, no <tool_call", []),
    (None, "auto", '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>', None, None,
     [("get_time", {"tz": "UTC"})]),
    ("qwen3", "required", f"<think>{THINK}</think>" + json.dumps(
        [{"name": "get_weather", "parameters": WEATHER}, {"name": "get_time", "parameters": {}}]),
     THINK, None, [("get_weather", WEATHER), ("get_time", {})]),
    ("deepseek_r1", NAMED, f"{THINK}</think>" + json.dumps(WEATHER, ensure_ascii=False), THINK, None,
     [("get_weather", WEATHER)]),
    (None, NAMED, json.dumps(WEATHER), None, None, [("get_weather", WEATHER)]),
    ("qwen3", None, f"<think>{THINK}</think>The answer.", THINK, "The answer.", []),
    ("qwen3", None, "<think>cut off while thinki", "cut off while thinki", None, []),
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tool_tokenizer()


def make(tokenizer, reasoning, tool_choice, **kwargs) -> ChoiceOutput:
    reasoner = get_reasoning_parser(reasoning)(tokenizer) if reasoning else None
    if tool_choice == "auto":
        tools = get_tool_parser("hermes")(tokenizer)
    elif tool_choice is not None:
        tools = ForcedToolCallParser(tool_choice)
    else:
        tools = None
    return ChoiceOutput(reasoner, tools, **kwargs)


def streamed(output: ChoiceOutput, pieces: list[str]) -> tuple[str | None, str | None, list]:
    """The stream's deltas concatenated as a client does (tool calls merged by index)."""
    reasoning, content, calls = "", "", {}
    for i, piece in enumerate(pieces):
        delta = output.feed(piece, final=i == len(pieces) - 1)
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for call in delta.tool_calls:
            entry = calls.setdefault(call.index, {"name": None, "arguments": "", "ids": []})
            entry["ids"] += [call.id] if call.id else []
            entry["name"] = call.function.name or entry["name"]
            entry["arguments"] += call.function.arguments or ""
    assert all(len(entry["ids"]) == 1 for entry in calls.values())  # id and type once, first
    return reasoning or None, content or None, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]


def whole(output: ChoiceOutput, text: str) -> tuple[str | None, str | None, list]:
    parsed = output.parse(text)
    return parsed.reasoning, parsed.content, [(c.function.name, c.function.arguments) for c in parsed.tool_calls]


@pytest.mark.parametrize("reasoning_name,tool_choice,text,reasoning,content,calls", CASES)
def test_whole_text_against_the_written_values(tokenizer, reasoning_name, tool_choice, text, reasoning, content,
                                               calls):
    got_reasoning, got_content, got_calls = whole(make(tokenizer, reasoning_name, tool_choice), text)
    assert (got_reasoning, got_content) == (reasoning, content)
    assert [(name, json.loads(arguments)) for name, arguments in got_calls] == calls


@pytest.mark.parametrize("reasoning_name,tool_choice,text,reasoning,content,calls", CASES)
def test_every_split_streams_the_whole_result(tokenizer, reasoning_name, tool_choice, text, reasoning, content,
                                              calls):
    expected = whole(make(tokenizer, reasoning_name, tool_choice), text)
    for cut in range(len(text) + 1):
        assert streamed(make(tokenizer, reasoning_name, tool_choice), [text[:cut], text[cut:]]) == expected, cut
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), k=rng.randint(1, min(12, len(text) - 1))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert streamed(make(tokenizer, reasoning_name, tool_choice), pieces + [""]) == expected, pieces
    detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)  # as the engine streams
    pieces = [detokenizer.add_tokens([t]) for t in tokenizer.encode(text, add_special_tokens=False)]
    pieces.append(detokenizer.flush())
    assert "".join(pieces) == text
    assert streamed(make(tokenizer, reasoning_name, tool_choice), pieces) == expected


def test_parallel_tool_calls_false_and_include_reasoning_false(tokenizer):
    text = CASES[1][2]
    output = make(tokenizer, "qwen3", "auto", parallel_tool_calls=False, include_reasoning=False)
    assert whole(output, text) == (None, "Two calls.", [("get_weather", json.dumps(WEATHER))])
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    stream_output = make(tokenizer, "qwen3", "auto", parallel_tool_calls=False, include_reasoning=False)
    assert streamed(stream_output, pieces) == (None, "Two calls.", [("get_weather", json.dumps(WEATHER))])
    assert stream_output.tools_called


def test_without_parsers_the_text_passes_through(tokenizer):
    output = ChoiceOutput()
    assert not output.parses
    assert output.parse("<think>x</think><tool_call>") .content == "<think>x</think><tool_call>"
    assert output.feed("ab").content == "ab" and output.feed("", final=True) is None


def test_malformed_call_is_content_whole_and_in_a_stream_that_sent_none(tokenizer):
    text = '<think>r</think>Here: <tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'
    expected = ("r", 'Here: <tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', [])
    assert whole(make(tokenizer, "qwen3", "auto"), text) == expected
    for cut in range(len(text) + 1):
        assert streamed(make(tokenizer, "qwen3", "auto"), [text[:cut], text[cut:]]) == expected


# -- GPT-OSS harmony: openai_gptoss for the reasoning, the openai tool parser reads the whole text ------

HARMONY_THINK = "The user wants Paris's weather. Café 😀"
HARMONY_CALL = ("<|channel|>analysis<|message|>" + HARMONY_THINK + "<|end|>"
                "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
                "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                + json.dumps(WEATHER, ensure_ascii=False) + "<|call|>"
                '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"tz": "UTC"}')
HARMONY_FINAL = ("<|channel|>analysis<|message|>" + HARMONY_THINK + "<|end|>"
                 "<|start|>assistant<|channel|>final<|message|>Sunny, 20 °C.")
# (reasoning parser, tool parser, text, reasoning, content, calls)
HARMONY_CASES = [
    ("openai_gptoss", "openai", HARMONY_CALL, HARMONY_THINK, "Checking.",
     [("get_weather", WEATHER), ("get_time", {"tz": "UTC"})]),
    ("openai_gptoss", "openai", HARMONY_FINAL, HARMONY_THINK, "Sunny, 20 °C.", []),
    ("openai_gptoss", None, HARMONY_CALL, HARMONY_THINK, "Checking.", []),
    (None, "openai", HARMONY_CALL, None, "Checking.", [("get_weather", WEATHER), ("get_time", {"tz": "UTC"})]),
    (None, "openai", HARMONY_FINAL, None, "Sunny, 20 °C.", []),  # the analysis is never content
]


@pytest.fixture(scope="module")
def harmony_tokenizer():
    from kvserve.testing.harmony_tokenizer import build_harmony_tokenizer

    return build_harmony_tokenizer()


def make_harmony(tokenizer, reasoning, tools, **kwargs) -> ChoiceOutput:
    return ChoiceOutput(get_reasoning_parser(reasoning)(tokenizer) if reasoning else None,
                        get_tool_parser(tools)(tokenizer) if tools else None, **kwargs)


@pytest.mark.parametrize("reasoning_name,tool_name,text,reasoning,content,calls", HARMONY_CASES)
def test_harmony_whole_and_streamed(harmony_tokenizer, reasoning_name, tool_name, text, reasoning, content, calls):
    expected = whole(make_harmony(harmony_tokenizer, reasoning_name, tool_name), text)
    assert expected[:2] == (reasoning, content)
    assert [(name, json.loads(arguments)) for name, arguments in expected[2]] == calls
    for cut in range(len(text) + 1):
        output = make_harmony(harmony_tokenizer, reasoning_name, tool_name)
        assert streamed(output, [text[:cut], text[cut:]]) == expected, cut
    detokenizer = IncrementalDetokenizer(harmony_tokenizer, [], skip_special_tokens=False)
    pieces = [detokenizer.add_tokens([t]) for t in harmony_tokenizer.encode(text, add_special_tokens=False)]
    pieces.append(detokenizer.flush())
    assert streamed(make_harmony(harmony_tokenizer, reasoning_name, tool_name), pieces) == expected


def test_harmony_parallel_tool_calls_false_and_include_reasoning_false(harmony_tokenizer):
    options = {"parallel_tool_calls": False, "include_reasoning": False}
    expected = (None, "Checking.", [("get_weather", json.dumps(WEATHER, ensure_ascii=False))])
    assert whole(make_harmony(harmony_tokenizer, "openai_gptoss", "openai", **options), HARMONY_CALL) == expected
    output = make_harmony(harmony_tokenizer, "openai_gptoss", "openai", **options)
    assert streamed(output, [HARMONY_CALL[i:i + 5] for i in range(0, len(HARMONY_CALL), 5)]) == expected
    assert output.tools_called
