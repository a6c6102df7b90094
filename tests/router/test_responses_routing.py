"""OpenAI's /v1/responses at the router: POST is forwarded and routed by its prompt, which the
router renders as the worker does (instructions + input -> chat messages); a follow-up
(``previous_response_id``) has its history on the worker that stored it, so it has no prompt here
(routed by load), and GET/DELETE/cancel of a stored response are not forwarded."""

from __future__ import annotations

from kvserve.api.tokenization import render_chat
from kvserve.router.forwarding import FORWARDED_PATHS, _max_tokens
from kvserve.router.prompts import PromptTokenizer
from kvserve.testing.tool_checkpoint import build_tool_tokenizer

BODY = {"model": "m", "max_output_tokens": 7, "instructions": "Be brief.", "input": [
    {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
    {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "18 C"}],
    "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}], "tool_choice": "none"}


def test_the_prompt_of_a_responses_body_is_its_chat_conversation():
    tokenizer = build_tool_tokenizer()
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "w", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18 C", "tool_call_id": "c1"}]
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    expected = render_chat(tokenizer, chat, add_generation_prompt=True, continue_final_message=False,
                           chat_template=None, tools=tools)
    prompts = PromptTokenizer(tokenizer)
    assert prompts.token_ids("/v1/responses", BODY) == expected
    assert prompts.token_ids("/v1/responses", {"model": "m", "input": "Hi"}) == render_chat(
        tokenizer, [{"role": "user", "content": "Hi"}], add_generation_prompt=True, continue_final_message=False,
        chat_template=None)
    assert prompts.token_ids("/v1/responses", {**BODY, "previous_response_id": "resp_1"}) is None
    assert prompts.token_ids("/v1/responses", {**BODY, "tools": [{"type": "web_search"}]}) is None  # the worker's 400


def test_only_creating_a_response_is_forwarded_and_its_budget_counts():
    assert "/v1/responses" in FORWARDED_PATHS
    assert not any(path.startswith("/v1/responses/") for path in FORWARDED_PATHS)
    assert _max_tokens(BODY) == 7 and _max_tokens({"input": "x"}) == 16
