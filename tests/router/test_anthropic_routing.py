"""Anthropic's /v1/messages at the router: forwarded like chat (the key also as x-api-key, the
anthropic-* headers passed on, the router's own errors in Anthropic's shape) and routed by its
prompt, which the router renders as the worker does (system + messages -> chat messages)."""

from __future__ import annotations

import httpx
from fake_worker import FakeWorker
from fleet_helpers import wait_for
from test_proxy import RouterThread, _config

from kvserve.api.tokenization import render_chat
from kvserve.router.prompts import PromptTokenizer
from kvserve.testing.tool_checkpoint import build_tool_tokenizer

BODY = {"model": "m", "max_tokens": 5, "system": "Be brief.", "messages": [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18 C"},
                                 {"type": "text", "text": "Thanks."}]}],
    "tools": [{"name": "w", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]}


def test_the_prompt_of_a_messages_body_is_its_chat_conversation():
    tokenizer = build_tool_tokenizer()
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "t1", "type": "function",
                             "function": {"name": "w", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18 C", "tool_call_id": "t1"}, {"role": "user", "content": "Thanks."}]
    tools = [{"type": "function", "function": {"name": "w", "parameters": BODY["tools"][0]["input_schema"]}}]
    expected = render_chat(tokenizer, chat, add_generation_prompt=True, continue_final_message=False,
                           chat_template=None, tools=tools)
    prompts = PromptTokenizer(tokenizer)
    assert prompts.token_ids("/v1/messages", BODY) == expected
    assert prompts.token_ids("/v1/messages", {"model": "m", "messages": "not a list"}) is None  # routed by load
    assert prompts.token_ids("/v1/messages", {**BODY, "tools": [{"type": "web_search_20250305",
                                                                 "name": "s"}]}) is None


def test_the_router_forwards_messages_with_anthropic_keys_and_errors():
    with FakeWorker("a", model="m") as worker:
        with RouterThread(_config([worker], api_keys=("sk-1",))) as router:
            wait_for(lambda: router.router.fleet.get(worker.url).model == "m", 10, "model learned")
            headers = {"x-api-key": "sk-1", "anthropic-version": "2023-06-01", "anthropic-beta": "b1"}
            answer = httpx.post(router.url + "/v1/messages", json=BODY, headers=headers)
            assert answer.status_code == 200 and answer.json() == {"worker": "a", "model": "m"}
            seen = worker.seen[-1]["headers"]
            assert (seen["x-api-key"], seen["anthropic-version"], seen["anthropic-beta"]) == ("sk-1", "2023-06-01",
                                                                                            "b1")
            missing = httpx.post(router.url + "/v1/messages", json=BODY)
            assert missing.status_code == 401 and missing.json()["type"] == "error"
            assert missing.json()["error"]["type"] == "authentication_error"
            unknown = httpx.post(router.url + "/v1/messages", json={**BODY, "model": "nope"}, headers=headers)
            assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
            # x-api-key is not a key on the OpenAI routes, whose errors keep OpenAI's shape
            chat = httpx.post(router.url + "/v1/chat/completions", json={"model": "m", "messages": []},
                              headers={"x-api-key": "sk-1"})
            assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"
