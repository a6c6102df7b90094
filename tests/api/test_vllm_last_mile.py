"""The last client-visible differences from vLLM 0.32, each pinned to vLLM's behaviour as its
source reads (vllm/entrypoints/openai/{completion,chat_completion}/{protocol,serving}.py,
vllm/sampling_params.py, vllm/v1/sample/sampler.py, serve/tokenize): ``return_token_ids``, chat
``echo``, the fields vLLM sends as null, ``n > 1`` when greedy, ``logit_bias`` clamping,
logprobs after the grammar's mask, ``/tokenize``'s vocabulary pieces and chat special tokens,
and the model card's ``permission``. (The default ``max_tokens`` and the context 400 are in
test_e2e_user_mistakes.py and test_server_errors.py; /ping, /invocations, /load in
test_routes_auth.py.)"""

from __future__ import annotations

import json
import math

import httpx
import pytest

MODEL = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture
def http(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=120,
                      headers={"Authorization": "Bearer test-key"}) as client:
        yield client


def post(http, path: str, body: dict) -> dict:
    response = http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    return response.json()


def chunks(http, path: str, body: dict) -> list[dict]:
    response = http.post(path, json={"model": MODEL, **body, "stream": True})
    assert response.status_code == 200, response.text
    events = [line[len("data: "):] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def tokenize(http, **body) -> list[int]:
    return post(http, "/tokenize", body)["tokens"]


def test_completion_return_token_ids(http, live_server):
    greedy = {"prompt": "The fox", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    plain = post(http, "/v1/completions", greedy)["choices"][0]
    assert plain["prompt_token_ids"] is None and plain["token_ids"] is None  # present, null (vLLM)
    choice = post(http, "/v1/completions", {**greedy, "return_token_ids": True})["choices"][0]
    assert choice["prompt_token_ids"] == tokenize(http, prompt="The fox")
    assert len(choice["token_ids"]) == 6 and live_server.tokenizer.decode(choice["token_ids"]) == choice["text"]
    streamed = [c["choices"][0] for c in chunks(http, "/v1/completions", {**greedy, "return_token_ids": True})]
    assert streamed[0]["prompt_token_ids"] == choice["prompt_token_ids"]  # the first chunk only
    assert all(c["prompt_token_ids"] is None for c in streamed[1:])
    assert sum((c["token_ids"] for c in streamed), []) == choice["token_ids"]


def test_chat_return_token_ids(http):
    greedy = {"messages": MESSAGES, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    plain = post(http, "/v1/chat/completions", greedy)
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
    body = post(http, "/v1/chat/completions", {**greedy, "return_token_ids": True})
    assert body["prompt_token_ids"] == tokenize(http, messages=MESSAGES)
    assert len(body["choices"][0]["token_ids"]) == 5
    streamed = chunks(http, "/v1/chat/completions", {**greedy, "return_token_ids": True})
    assert streamed[0]["choices"][0]["delta"]["role"] == "assistant"
    assert streamed[0]["prompt_token_ids"] == body["prompt_token_ids"]  # the role chunk carries the prompt
    assert all(c.get("prompt_token_ids") is None for c in streamed[1:])
    ids = sum((c["choices"][0]["token_ids"] for c in streamed[1:]), [])
    assert ids == body["choices"][0]["token_ids"]


def test_chat_echo_repeats_the_message_of_the_replys_role(http):
    prefill = [*MESSAGES, {"role": "assistant", "content": "Once upon"}]
    greedy = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
    continued = post(http, "/v1/chat/completions", {**greedy, "messages": prefill, "add_generation_prompt": False,
                                                    "continue_final_message": True})
    echoed = post(http, "/v1/chat/completions", {**greedy, "messages": prefill, "add_generation_prompt": False,
                                                 "continue_final_message": True, "echo": True})
    message = echoed["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["content"] == "Once upon" + continued["choices"][0]["message"]["content"]
    prompt = tokenize(http, messages=prefill, add_generation_prompt=False, continue_final_message=True)
    assert [next(iter(entry)) if entry else None for entry in echoed["prompt_logprobs"]][1:] == \
        [str(t) for t in prompt[1:]]  # echo asks for the prompt's logprobs too (vLLM: top_logprobs 0)
    assert continued["prompt_logprobs"] is None
    # A user message last: the reply is the assistant's, so nothing is echoed.
    user_last = post(http, "/v1/chat/completions", {**greedy, "messages": MESSAGES, "echo": True})
    assert user_last["choices"][0]["message"]["content"] == post(
        http, "/v1/chat/completions", {**greedy, "messages": MESSAGES})["choices"][0]["message"]["content"]
    streamed = chunks(http, "/v1/chat/completions", {**greedy, "messages": prefill, "add_generation_prompt": False,
                                                     "continue_final_message": True, "echo": True})
    deltas = [c["choices"][0]["delta"] for c in streamed]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": "Once upon"}
    assert "".join(d.get("content", "") for d in deltas) == message["content"]


def test_fields_vllm_sends_as_null_are_present(http):
    chat = post(http, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2})
    assert {"service_tier", "system_fingerprint", "prompt_logprobs", "prompt_token_ids", "kv_transfer_params"} <= \
        set(chat) and chat["service_tier"] is None and chat["kv_transfer_params"] is None
    message = chat["choices"][0]["message"]
    assert all(message[k] is None for k in ("refusal", "annotations", "audio", "function_call"))
    assert {"logprobs", "finish_reason", "stop_reason", "token_ids"} <= set(chat["choices"][0])
    completion = post(http, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert completion["service_tier"] is None and completion["kv_transfer_params"] is None
    assert {"logprobs", "stop_reason", "prompt_logprobs", "prompt_token_ids", "token_ids"} <= \
        set(completion["choices"][0])


def test_n_above_1_when_greedy_is_400_in_vllms_words(http):
    for path, body in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": MESSAGES})):
        response = http.post(path, json={"model": MODEL, **body, "n": 2, "temperature": 0})
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "n must be 1 when using greedy sampling, got 2."
        assert http.post(path, json={"model": MODEL, **body, "n": 2, "temperature": 0.5,
                                     "max_tokens": 2}).status_code == 200


def test_logit_bias_beyond_100_is_clamped(http, live_server):
    token = tokenize(http, prompt=" world", add_special_tokens=False)[0]
    base = {"prompt": "The fox", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    at_100 = post(http, "/v1/completions", {**base, "logit_bias": {str(token): 100}})["choices"][0]
    at_500 = post(http, "/v1/completions", {**base, "logit_bias": {str(token): 500}})["choices"][0]
    assert at_500["text"] == at_100["text"] == live_server.tokenizer.decode([token] * 4)
    assert at_500["logprobs"] == at_100["logprobs"]


def test_logprobs_are_taken_after_the_grammar(http):
    """vLLM masks the logits with the grammar before its sampler takes raw logprobs: the
    alternatives a grammar forbids are -inf (-9999.0 in JSON) and the allowed ones sum to 1."""
    body = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0, "logprobs": True, "top_logprobs": 20,
            "structured_outputs": {"choice": ["yes", "no"]}}
    first = post(http, "/v1/chat/completions", body)["choices"][0]["logprobs"]["content"][0]
    values = [alt["logprob"] for alt in first["top_logprobs"]]
    assert -9999.0 in values  # the grammar forbids some of the 20 most likely tokens
    assert math.isclose(sum(math.exp(v) for v in values if v > -9999.0), 1.0, rel_tol=1e-4)
    free = post(http, "/v1/chat/completions", {**body, "structured_outputs": None})
    assert -9999.0 not in [a["logprob"] for a in free["choices"][0]["logprobs"]["content"][0]["top_logprobs"]]


def test_tokenize_token_strs_and_chat_special_tokens(http, live_server):
    tokenizer = live_server.tokenizer
    out = post(http, "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    assert out["token_strs"] == tokenizer.convert_ids_to_tokens(out["tokens"])  # vocabulary pieces
    assert post(http, "/tokenize", {"prompt": "Hello world"})["token_strs"] is None
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tokenize(http, messages=MESSAGES) == tokenizer.encode(text, add_special_tokens=False)
    assert tokenize(http, messages=MESSAGES, add_special_tokens=True) == tokenizer.encode(text)
    response = http.post("/tokenize", json={"messages": MESSAGES, "continue_final_message": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "continue_final_message"


def test_model_cards_carry_vllms_permission(http):
    card = http.get("/v1/models").json()["data"][0]
    permission = card["permission"]
    assert len(permission) == 1 and permission[0]["object"] == "model_permission"
    assert permission[0]["id"].startswith("modelperm-")
    assert {k: permission[0][k] for k in ("allow_sampling", "allow_logprobs", "allow_view", "organization",
                                          "is_blocking")} == {"allow_sampling": True, "allow_logprobs": True,
                                                              "allow_view": True, "organization": "*",
                                                              "is_blocking": False}
