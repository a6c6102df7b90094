"""tool_choice required / named: vLLM's validation messages and forcing schema, random walks of a
grammar backend through that schema read back as calls whose arguments validate (jsonschema),
streamed equal to whole, and parallel_tool_calls false."""

from __future__ import annotations

import copy
import json
import random

import jsonschema
import pytest
from test_parsers import random_pieces, stream

from kvserve.errors import InvalidRequestError
from kvserve.structured_output import StructuredOutputsConfig, StructuredOutputsParams, create_backend
from kvserve.testing import build_tokenizer
from kvserve.testing.grammar_walk import random_walk
from kvserve.tool_parsers import (
    DeltaFunctionCall,
    DeltaToolCall,
    ForcedToolCallParser,
    ToolCallDelta,
    forced_tool_schema,
    limit_tool_call_deltas,
    limit_tool_calls,
    validate_tool_choice,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]},
                   "unit": {"$ref": "#/$defs/unit"}},
    "required": ["city", "unit"], "additionalProperties": False,
    "$defs": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
    "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME, ADD]


def test_defaults_and_errors_as_vllm():
    assert validate_tool_choice(None, None) == "none"
    assert validate_tool_choice(None, TOOLS) == "auto"
    assert validate_tool_choice("required", TOOLS) == "required"
    named = {"type": "function", "function": {"name": "add"}}
    assert validate_tool_choice(named, TOOLS) == named
    cases = [
        (("auto", []), "tools", "`tools` must not be an empty array"),
        (("required", None), "tool_choice", "When using `tool_choice`, `tools` must be set."),
        (("any", TOOLS), "tool_choice", "Only named tools, \"none\", \"auto\" or \"required\""),
        (({"type": "function", "function": {}}, TOOLS), "tool_choice.function.name", "Invalid `name`"),
        (({"type": "function", "function": {"name": "nope"}}, TOOLS), "tool_choice",
         "does not match any of the specified `tools`"),
    ]
    for args, param, words in cases:
        with pytest.raises(InvalidRequestError) as info:
            validate_tool_choice(*args)
        assert info.value.param == param and words in info.value.message
    with pytest.raises(InvalidRequestError, match="either use constraints for structured outputs"):
        validate_tool_choice(named, TOOLS, structured_outputs=True)


def test_forcing_schemas():
    tools = copy.deepcopy(TOOLS)
    schema = forced_tool_schema("required", tools)
    assert tools == TOOLS  # the request is not modified
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert schema["$defs"] == {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"], ["add"]]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object",
                                                                       "properties": {}}
    good = [{"name": "get_weather", "parameters": {"city": "Lima", "unit": "celsius"}},
            {"name": "get_time", "parameters": {}}]
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "add", "parameters": {"a": "x", "b": True}}], schema)
    assert forced_tool_schema({"type": "function", "function": {"name": "add"}}, tools) == \
        ADD["function"]["parameters"]
    assert forced_tool_schema({"type": "function", "function": {"name": "get_time"}}, tools) == \
        {"type": "object", "properties": {}}
    assert forced_tool_schema("auto", tools) is None and forced_tool_schema("none", tools) is None
    clash = copy.deepcopy(ADD)
    clash["function"]["parameters"]["$defs"] = {"unit": {"type": "integer"}}
    with pytest.raises(InvalidRequestError, match="'unit' has multiple schemas"):
        forced_tool_schema("required", [WEATHER, clash])


@pytest.fixture(scope="module")
def backend():
    tokenizer = build_tokenizer("bpe")
    return create_backend(tokenizer, len(tokenizer), [1, 3], StructuredOutputsConfig())


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}},
                                         {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_outputs_are_valid_calls_whole_and_streamed(backend, tool_choice):
    schema = forced_tool_schema(tool_choice, TOOLS)
    compiled = backend.compile(StructuredOutputsParams(json=schema, disable_any_whitespace=True,
                                                       source="tool_choice"))
    parameters = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"}
                  for t in TOOLS}
    finished = 0
    for seed in range(8):
        tokens, done = random_walk(backend, compiled, seed, max_steps=150)
        if not done:
            continue
        finished += 1
        text = backend.tokenizer.decode(tokens)
        result = ForcedToolCallParser(tool_choice).extract_tool_calls(text)
        assert result.tools_called and result.content is None, text
        for call in result.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), parameters[call.function.name])
        expected = ("", [(c.function.name, c.function.arguments) for c in result.tool_calls])
        for s in range(20):
            pieces = random_pieces(text, random.Random(s)) if len(text) > 1 else [text]
            assert stream(ForcedToolCallParser(tool_choice), pieces)[:2] == expected
    assert finished >= 3


def test_forced_output_cut_short_is_content():
    text = '[{"name": "add", "parameters": {"a": 1'
    result = ForcedToolCallParser("required").extract_tool_calls(text)
    assert not result.tools_called and result.content == text
    named = ForcedToolCallParser({"type": "function", "function": {"name": "add"}})
    assert named.extract_tool_calls('{"a": 1, "b": true}').tool_calls[0].function.arguments == \
        '{"a": 1, "b": true}'
    assert not named.extract_tool_calls('{"a": 1').tools_called


def test_parallel_tool_calls_false_keeps_the_first_call():
    result = ForcedToolCallParser("required").extract_tool_calls(
        '[{"name": "get_time", "parameters": {}}, {"name": "add", "parameters": {"a": 1, "b": true}}]')
    assert len(limit_tool_calls(result.tool_calls, None)) == 2
    assert limit_tool_calls(result.tool_calls, False) == result.tool_calls[:1]
    delta = ToolCallDelta(content=None, tool_calls=(
        DeltaToolCall(0, function=DeltaFunctionCall(arguments="}")),
        DeltaToolCall(1, id="x", type="function", function=DeltaFunctionCall(name="add"))))
    assert limit_tool_call_deltas(delta, False).tool_calls == delta.tool_calls[:1]
    assert limit_tool_call_deltas(delta, True) is delta
    only_second = ToolCallDelta(tool_calls=delta.tool_calls[1:])
    assert limit_tool_call_deltas(only_second, False) is None
