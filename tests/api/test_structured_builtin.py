"""The structured-output cases a client sends, with kvserve's defaults, on the built-in model (a
weak model: it writes prose into every string): ``response_format`` ``json_schema`` (plain and
``strict``, as ``client.beta.chat.completions.parse`` sends it), ``json_object``, and tool calls
under ``tool_choice`` ``required`` and a named function. Every answer is valid JSON (and valid
against its schema) within ``max_tokens``."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from kvserve.builtin import builtin_model_path
from kvserve.testing.live_server import start_live_server

MODEL = "builtin-structured"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query"]}}}
SCHEMAS = {
    "person": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"]}, "Tell me about a person."),
    "fruits": ({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}},
                "required": ["items"]}, "List some fruits."),
    "answer": ({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "number"}},
                "required": ["answer", "confidence"]}, "Is the sky blue?"),
    "book": ({"type": "object", "properties": {
        "title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object", "properties": {"pages": {"type": "integer"}}, "required": ["pages"]}},
        "required": ["title", "tags", "meta"], "additionalProperties": False}, "Describe a book."),
}


def _cases():
    for name, (schema, question) in SCHEMAS.items():
        for strict in (False, True):
            yield f"{name}-strict" if strict else name, {
                "messages": [{"role": "user", "content": question}],
                "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                                           **({"strict": True} if strict else {})}}}
    yield "json_object", {"messages": [{"role": "user", "content": "A JSON object."}],
                          "response_format": {"type": "json_object"}}
    yield "required", {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
                       "tool_choice": "required"}
    yield "required-of-two", {"messages": [{"role": "user", "content": "Find cats."}], "tools": [WEATHER, SEARCH],
                              "tool_choice": "required"}
    yield "named", {"messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": [WEATHER, SEARCH],
                    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


@pytest.fixture(scope="module")
def http():
    server = start_live_server(str(builtin_model_path()), served_model_name=MODEL, api_key="k")
    with httpx.Client(base_url=server.base_url, headers={"Authorization": "Bearer k"}, timeout=300) as client:
        yield client
    server.stop()


@pytest.mark.parametrize("name, body", list(_cases()))
@pytest.mark.parametrize("max_tokens", [80])
def test_valid_json_within_max_tokens(http, name, body, max_tokens):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "temperature": 0, "max_tokens": max_tokens, **body})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert r.json()["usage"]["completion_tokens"] <= max_tokens
    message = choice["message"]
    if "tools" in body:
        calls = message["tool_calls"]
        assert calls and all(c["function"]["name"] in ("get_weather", "search") for c in calls), message
        tools = {t["function"]["name"]: t["function"]["parameters"] for t in body["tools"]}
        for call in calls:
            jsonschema.validate(json.loads(call["function"]["arguments"]), tools[call["function"]["name"]])
    else:
        value = json.loads(message["content"])
        spec = body["response_format"]
        schema = spec["json_schema"]["schema"] if spec["type"] == "json_schema" else {"type": "object"}
        jsonschema.validate(value, schema)
    assert choice["finish_reason"] in ("stop", "tool_calls")
