"""Tool-call parsers on model texts written from the documented formats (Qwen2.5/Qwen3/Hermes
chat templates, Llama 3.1/3.2 model cards, mistral_common's own encoding of assistant tool calls
decoded by the test tokenizers): whole-text results against independent references (``json``),
and streams cut at every single split point and at random multi-piece splits (many seeds), plus
token by token, which must add up to the whole-text result."""

from __future__ import annotations

import json
import os
import random
import re

import pytest
from tool_streams import stream

from kvserve.testing import build_tokenizer
from kvserve.tool_parsers import get_tool_parser

ID = re.compile(r"^chatcmpl-tool-[0-9a-f]{32}$")
MISTRAL_ID = re.compile(r"^[A-Za-z0-9]{9}$")

WEATHER = {"location": "San Francisco, CA, USA", "unit": "celsius"}
NESTED = {"query": 'say "hi"\\n', "tags": ["é", "😀", "東京"], "n": -12.5e-1, "ok": True,
          "none": None, "deep": {"a": [1, {"b": []}]}}

# (parser, text, [(name, arguments)], content)
CASES = [
    ("hermes", '<tool_call>\n{"name": "get_current_temperature", "arguments": '
     '{"location": "San Francisco, CA, USA", "unit": "celsius"}}\n</tool_call>',
     [("get_current_temperature", WEATHER)], None),
    ("hermes", "Let me look both up.\n\n<tool_call>\n" + json.dumps(
        {"name": "search", "arguments": NESTED}) + "\n</tool_call>\n<tool_call>\n"
     '{"name": "get_time", "arguments": {}}\n</tool_call>',
     [("search", NESTED), ("get_time", {})], "Let me look both up.\n\n"),
    ("hermes", "<tool_call>\n" + json.dumps({"name": "search", "arguments": NESTED},
                                            ensure_ascii=False) + "\n",  # EOS before </tool_call>
     [("search", NESTED)], None),
    ("hermes", '<tool_call>{"arguments":{"x":"\\u00e9\\ud83d\\ude00"},"name":"f"}</tool_call>',
     [("f", {"x": "é😀"})], None),
    ("llama3_json", '{"name": "get_weather", "parameters": {"location": "San Francisco, CA, USA", '
     '"unit": "celsius"}}', [("get_weather", WEATHER)], None),
    ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", '
     '"arguments": ' + json.dumps(NESTED, ensure_ascii=False) + "}",
     [("a", {"x": 1}), ("b", NESTED)], None),
    ("pythonic", '[get_weather(location="San Francisco, CA, USA", unit=\'celsius\'), get_time()]',
     [("get_weather", WEATHER), ("get_time", {})], None),
    ("pythonic", "[search(query='say \"hi\"\\\\n', tags=['é', \"😀\", '東京'], n=-12.5e-1, "
     "ok=True, none=None, deep={'a': [1, {'b': ()}]})]", [("search", NESTED)], None),
    ("pythonic", '  [f(a=true, b=null, c=false,)]', [("f", {"a": True, "b": None, "c": False})],
     None),
    ("mistral", "[TOOL_CALLS]get_weather[ARGS]" + json.dumps(WEATHER, ensure_ascii=False),
     [("get_weather", WEATHER)], None),
    ("mistral", "Checking.[TOOL_CALLS]search[CALL_ID]abcDEF123[ARGS]" + json.dumps(
        NESTED, ensure_ascii=False) + "[TOOL_CALLS]get_time[ARGS]{}",
     [("search", NESTED), ("get_time", {})], "Checking."),
    ("mistral", '[TOOL_CALLS]get_weather{"location": "San Francisco, CA, USA", "unit": "celsius"}',
     [("get_weather", WEATHER)], None),
]

NO_CALLS = [
    ("hermes", "No tools needed: the answer is 4. Tags look like <tool_call> only in docs"),
    ("hermes", "Plain answer that ends with a partial tag <tool_"),
    ("llama3_json", "The weather in Paris is sunny."),
    ("llama3_json", '{"answer": 42}'),
    ("pythonic", "Hello! How can I help?"),
    ("pythonic", "[1] is a citation."),
    ("mistral", "Bonjour, comment puis-je aider ?"),
]

MALFORMED = [
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>'),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": "unterminated'),
    ("hermes", "<tool_call>\nnot json at all\n</tool_call>"),
    ("hermes", '<tool_call>{"name": "f"}</tool_call>'),
    ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'),
    ("hermes", '<tool_call>{"name": "f", "arguments": {}} trailing</tool_call>'),
    ("hermes", '<tool_call>{"name": "f", "name": "g", "arguments": {}}</tool_call>'),
    # cut by max_tokens inside the closing tag: vLLM's json.loads of '{...}</tool_' fails -> content
    ("hermes", 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_'),
    ("llama3_json", '{"name": "f", "parameters": {"a": tru}}'),
    ("pythonic", "[f(1, 2)]"),
    ("pythonic", "[f(a=x)]"),
    ("pythonic", "[f(a=1, a=2)]"),
    ("pythonic", "[f(a=float('nan'))]"),
    ("mistral", "[TOOL_CALLS]get weather[ARGS]{}"),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}'),
]


def whole(name, text):
    result = get_tool_parser(name)().extract_tool_calls(text)
    return (result.content or "", [(c.function.name, c.function.arguments) for c in result.tool_calls],
            result)


def random_pieces(text, rng):
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("name,text,calls,content", CASES)
def test_whole_text_against_json(name, text, calls, content):
    got_content, got_calls, result = whole(name, text)
    assert result.tools_called and result.content == content
    assert [(n, json.loads(a)) for n, a in got_calls] == calls
    ids = [c.id for c in result.tool_calls]
    assert all((MISTRAL_ID if name == "mistral" else ID).match(i) for i in ids)
    assert len(set(ids)) == len(ids)
    if name == "pythonic":  # arguments are json.dumps of the literals, exactly
        assert [a for _, a in got_calls] == [json.dumps(v, ensure_ascii=False) for _, v in calls]


@pytest.mark.parametrize("name,text,calls,content", CASES)
def test_every_split_streams_the_whole_result(name, text, calls, content):
    expected = whole(name, text)[:2]
    for cut in range(len(text) + 1):  # every two-piece split, including empty pieces
        assert stream(get_tool_parser(name)(), [text[:cut], text[cut:]])[:2] == expected, cut
    for seed in range(150):
        pieces = random_pieces(text, random.Random(seed))
        assert stream(get_tool_parser(name)(), pieces)[:2] == expected, (seed, pieces)
    assert stream(get_tool_parser(name)(), list(text))[:2] == expected


@pytest.mark.parametrize("name,text,calls,content", CASES[:4])
def test_delta_shapes_follow_openai(name, text, calls, content):
    _, _, deltas, by_index = stream(get_tool_parser(name)(), list(text))
    first = {}
    for delta in deltas:
        for call in delta.tool_calls if delta else ():
            if call.index not in first:
                first[call.index] = call
                assert ID.match(call.id) and call.type == "function"
                assert call.function.name == calls[call.index][0]
                as_dict = call.to_dict()
                assert set(as_dict) == {"index", "id", "type", "function"}
            else:
                assert call.id is None and call.type is None and call.function.name is None
                assert set(call.to_dict()) == {"index", "function"}
    assert len(first) == len(calls)


@pytest.mark.parametrize("name,text", NO_CALLS + MALFORMED)
def test_no_or_malformed_calls_are_content(name, text):
    content, calls, result = whole(name, text)
    assert not result.tools_called and result.tool_calls == () and result.content == text
    for seed in range(40):
        stream(get_tool_parser(name)(), random_pieces(text, random.Random(seed)))  # no exception


@pytest.mark.parametrize("name,text", NO_CALLS + [m for m in MALFORMED if m[1][-1] != "}"
                                                  or "tru}" in m[1]][:6])
def test_streams_that_never_sent_a_call_end_as_the_whole_content(name, text):
    for seed in range(40):
        content, calls, _, _ = stream(get_tool_parser(name)(), random_pieces(text, random.Random(seed)))
        if not calls:
            assert content == text


def token_pieces(tokenizer, ids):
    """The text pieces a detokenizer streams token by token (a piece waits while the text
    ends inside a multi-byte character)."""
    pieces, sent = [], ""
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k], skip_special_tokens=False)
        if text.endswith("\ufffd") and k < len(ids):
            continue
        assert text.startswith(sent)
        pieces.append(text[len(sent):])
        sent = text
    return pieces


def _mistral_text(kind: str, calls) -> str:
    """The text of mistral_common's encoding of an assistant tool-call message, decoded by the
    ``kind`` test tokenizer (the same ids the model would write)."""
    import mistral_common
    from mistral_common.protocol.instruct.messages import AssistantMessage
    from mistral_common.protocol.instruct.tool_calls import FunctionCall, ToolCall
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    files = {"sentencepiece": "mistral_instruct_tokenizer_240323.model.v3",
             "tekken": "tekken_240911.json"}
    path = os.path.join(os.path.dirname(mistral_common.__file__), "data", files[kind])
    instruct = MistralTokenizer.from_file(path).instruct_tokenizer
    message = AssistantMessage(tool_calls=[
        ToolCall(id=f"call{i:05d}", function=FunctionCall(name=n, arguments=json.dumps(a)))
        for i, (n, a) in enumerate(calls)])
    ids = instruct._encode_tool_calls_in_assistant_message(message)  # noqa: SLF001
    return ids, build_tokenizer(kind).decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("kind", ["sentencepiece", "tekken"])
def test_mistral_array_form_as_mistral_common_encodes_it(kind):
    calls = [("get_weather", WEATHER), ("search", NESTED)]
    ids, text = _mistral_text(kind, calls)
    assert text.startswith("[TOOL_CALLS]")
    content, got, result = whole("mistral", text)
    assert result.tools_called and result.content is None
    assert [(n, json.loads(a)) for n, a in got] == calls
    pieces = token_pieces(build_tokenizer(kind), ids)
    assert "".join(pieces) == text
    assert stream(get_tool_parser("mistral")(), pieces)[:2] == (content, got)


def test_hermes_token_by_token_with_the_bpe_tokenizer():
    tokenizer = build_tokenizer("bpe")
    text = CASES[1][1]
    pieces = token_pieces(tokenizer, tokenizer.encode(text, add_special_tokens=False))
    assert "".join(pieces) == text
    assert stream(get_tool_parser("hermes")(), pieces)[:2] == whole("hermes", text)[:2]


def test_unknown_parser_names_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: hermes, llama3_json, mistral, openai, pythonic"):
        get_tool_parser("qwen")
