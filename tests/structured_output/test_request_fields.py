"""Request fields to one StructuredOutputsParams: OpenAI's response_format, vLLM's
structured_outputs and guided_* fields (names and semantics from the OpenAI API reference and
vLLM's protocol.py), exactly-one-of validation and the messages of the 400s."""

from __future__ import annotations

import pytest

from kvserve.structured_output import (
    StructuredOutputError,
    StructuredOutputKind,
    StructuredOutputsParams,
    check_request_backend,
    structured_outputs_from_request,
)

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}


def test_text_and_nothing_are_unconstrained():
    assert structured_outputs_from_request() is None
    assert structured_outputs_from_request(response_format={"type": "text"}) is None


def test_response_format_json_object_and_json_schema():
    p = structured_outputs_from_request(response_format={"type": "json_object"})
    assert p.kind is StructuredOutputKind.JSON_OBJECT and p.json_object is True
    assert p.source == "response_format"
    p = structured_outputs_from_request(response_format={
        "type": "json_schema",
        "json_schema": {"name": "weather_1", "schema": SCHEMA, "strict": True},
    })
    assert p.kind is StructuredOutputKind.JSON and p.json == SCHEMA
    assert p.spec_text() == '{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}'


@pytest.mark.parametrize("response_format,param,words", [
    ({"type": "json_schema"}, "response_format.json_schema", "needs a json_schema object"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "response_format.json_schema.name",
     "1-64 characters"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}},
     "response_format.json_schema.name", "got 'a b'"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema",
     "must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": "yes"}},
     "response_format.json_schema.strict", "boolean"),
    ({"type": "yaml"}, "response_format", "must be one of text, json_object, json_schema"),
    ("json", "response_format", "must be an object"),
])
def test_bad_response_format_is_a_400_naming_the_field(response_format, param, words):
    with pytest.raises(StructuredOutputError) as info:
        structured_outputs_from_request(response_format=response_format)
    assert info.value.param == param and words in info.value.message


def test_vllm_structured_outputs_object_with_options():
    p = structured_outputs_from_request(structured_outputs={
        "regex": "[a-z]+", "disable_any_whitespace": True, "whitespace_pattern": " ?"})
    assert p == StructuredOutputsParams(regex="[a-z]+", disable_any_whitespace=True,
                                        whitespace_pattern=" ?")
    assert p.source == "structured_outputs"
    p = structured_outputs_from_request(structured_outputs={"choice": ["a", "b"]})
    assert p.choice == ("a", "b") and p.kind is StructuredOutputKind.CHOICE


@pytest.mark.parametrize("field,value,kind", [
    ("guided_json", SCHEMA, StructuredOutputKind.JSON),
    ("guided_json", '{"type": "object"}', StructuredOutputKind.JSON),
    ("guided_regex", "[0-9]+", StructuredOutputKind.REGEX),
    ("guided_choice", ["x", "y"], StructuredOutputKind.CHOICE),
    ("guided_grammar", 'root ::= "a"', StructuredOutputKind.GRAMMAR),
])
def test_older_guided_fields(field, value, kind):
    p = structured_outputs_from_request(**{field: value}, guided_decoding_backend="xgrammar")
    assert p.kind is kind and p.source == field and p.backend == "xgrammar"


def test_guided_json_text_that_is_not_json():
    with pytest.raises(StructuredOutputError) as info:
        structured_outputs_from_request(guided_json="{nope")
    assert info.value.param == "guided_json" and "not valid JSON" in info.value.message


@pytest.mark.parametrize("kwargs,named", [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex, response_format"),
    ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs.json, structured_outputs.regex"),
    ({"guided_choice": ["a"], "guided_grammar": "x"}, "guided_choice, guided_grammar"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
     "structured_outputs.choice, response_format"),
])
def test_two_constraints_are_refused(kwargs, named):
    with pytest.raises(StructuredOutputError) as info:
        structured_outputs_from_request(**kwargs)
    assert named in info.value.message and "at most one" in info.value.message


def test_structured_outputs_without_a_constraint_or_with_unknown_fields():
    with pytest.raises(StructuredOutputError) as info:
        structured_outputs_from_request(structured_outputs={"disable_any_whitespace": True})
    assert "needs one of json, regex, choice, grammar, json_object, structural_tag" in info.value.message
    with pytest.raises(StructuredOutputError) as info:
        structured_outputs_from_request(structured_outputs={"jsn": {}})
    assert "unknown field(s) jsn" in info.value.message


@pytest.mark.parametrize("kwargs,words", [
    ({"choice": []}, "choice must be a non-empty list of strings"),
    ({"choice": ["a", 1]}, "choice must be a non-empty list of strings"),
    ({"regex": ""}, "regex must be a non-empty string"),
    ({"grammar": "  "}, "grammar must be a non-empty string"),
    ({"json": 3}, "json must be a JSON Schema object"),
    ({}, "none is given"),
    ({"json_object": False}, "none is given"),
    ({"regex": "a", "choice": ["a"]}, "got regex, choice"),
])
def test_params_validation(kwargs, words):
    with pytest.raises(StructuredOutputError) as info:
        StructuredOutputsParams(**kwargs)
    assert words in info.value.message and info.value.param == "structured_outputs"


def test_cache_key_keeps_key_order_and_ignores_the_source():
    a = StructuredOutputsParams(json={"a": 1, "b": 2}, source="guided_json")
    b = StructuredOutputsParams(json='{"a": 1,  "b": 2}')
    c = StructuredOutputsParams(json={"b": 2, "a": 1})
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    assert a != c
    assert StructuredOutputsParams(json=SCHEMA) != StructuredOutputsParams(
        json=SCHEMA, disable_any_whitespace=True)


def test_backend_names():
    with pytest.raises(StructuredOutputError) as info:
        structured_outputs_from_request(guided_regex="a", guided_decoding_backend="outlines")
    assert "one of auto, xgrammar, guidance" in info.value.message
    p = structured_outputs_from_request(guided_regex="a", guided_decoding_backend="guidance:x")
    assert p.backend == "guidance"
    check_request_backend(p, "guidance")
    check_request_backend(p, "auto")
    with pytest.raises(StructuredOutputError) as info:
        check_request_backend(p, "xgrammar")
    assert info.value.param == "guided_decoding_backend" and "'xgrammar'" in info.value.message
