"""Mistakes a new user made against a live server (found in QA): each is a 400 with OpenAI's
error shape, the engine keeps serving, and nothing leaks."""

from __future__ import annotations

import json

import httpx
import pytest


@pytest.fixture
def http(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=60,
                      headers={"Authorization": f"Bearer {live_server.api_key}"}) as client:
        yield client


@pytest.mark.parametrize("field", ["temperature", "repetition_penalty", "top_p", "presence_penalty"])
def test_nan_sampling_values_are_400_and_engine_survives(live_server, http, field):
    raw = '{"model": "%s", "prompt": "Hi", "max_tokens": 3, "%s": NaN}' % (live_server.model, field)
    response = http.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field
    ok = http.post("/v1/completions", json={"model": live_server.model, "prompt": "Hi", "max_tokens": 2,
                                            "ignore_eos": True})
    assert ok.status_code == 200 and http.get("/health").status_code == 200


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", '{"prompt": "\\ud800 hi", "max_tokens": 3}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 3}'),
    ("/tokenize", '{"prompt": "\\ud800"}'),
])
def test_lone_surrogate_is_400(live_server, http, path, body):
    response = http.post(path, content=body.replace("{", '{"model": "%s", ' % live_server.model, 1),
                         headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert "surrogate" in response.json()["error"]["message"]


def test_omitted_or_null_max_tokens_is_16_and_must_fit_the_context(live_server, http):
    """vLLM 0.32: completions default to (and normalise ``null`` to) 16 tokens, and a prompt that
    leaves less room than the cap is a 400 naming the context, not a shorter answer."""
    tokenizer = live_server.tokenizer
    prompt_ids = tokenizer.encode("a b", add_special_tokens=False)[:1] * (live_server.max_model_len - 5)
    for extra in ({}, {"max_tokens": None}):
        response = http.post("/v1/completions", json={"model": live_server.model, "prompt": prompt_ids,
                                                      "ignore_eos": True, **extra})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"] == (
            "This model's maximum context length is 256 tokens. However, you requested 16 output tokens and your "
            "prompt contains 251 input tokens, for a total of 267 tokens. Please reduce the length of the input "
            "prompt or the number of requested output tokens.")
        short = http.post("/v1/completions", json={"model": live_server.model, "prompt": "Hi", "ignore_eos": True,
                                                   **extra})
        assert short.json()["usage"]["completion_tokens"] == 16  # OpenAI's default
    fits = http.post("/v1/completions", json={"model": live_server.model, "prompt": prompt_ids, "max_tokens": 5,
                                              "ignore_eos": True})
    assert fits.json()["usage"]["completion_tokens"] == 5


def test_retrieve_model_and_unknown_model(live_server):
    client = live_server.client
    assert client.models.retrieve(live_server.model).id == live_server.model
    import openai

    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_chat_top_logprobs_out_of_range_names_the_field(live_server, http):
    body = {"model": live_server.model, "messages": [{"role": "user", "content": "x"}], "logprobs": True,
            "top_logprobs": 21}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "top_logprobs"


# A lone surrogate where the request's text is not checked up front: a bad word (tokenized on the
# engine thread) and strings an error message quotes back (model name, content part type,
# response_format type). Each was a 500 whose body could not be encoded as UTF-8.
@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", '{"prompt": "Hi", "max_tokens": 2, "bad_words": ["ok", "\\ud800"]}', 400, "bad_words"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "bad_words": ["\\udfff x"]}', 400,
     "bad_words"),
    ("/v1/completions", '{"model": "\\ud800", "prompt": "Hi", "max_tokens": 2}', 404, "model"),
    ("/v1/completions", '{"model": "\\ud800", "prompt": "Hi", "max_tokens": 2, "stream": true}', 404, "model"),
    ("/v1/chat/completions", '{"model": "m\\ud800", "messages": [{"role": "user", "content": "Hi"}]}', 404,
     "model"),
    ("/tokenize", '{"model": "\\ud800", "prompt": "Hi"}', 404, "model"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "\\ud800"}]}]}', 400,
     "messages.0.content.0.type"),
    ("/v1/completions", '{"prompt": "Hi", "response_format": {"type": "\\ud800"}}', 400, "response_format"),
])
def test_lone_surrogate_in_other_fields_is_4xx_not_500(live_server, http, path, body, status, param):
    if '"model"' not in body:
        body = body.replace("{", f'{{"model": "{live_server.model}", ', 1)
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    ok = http.post("/v1/completions", json={"model": live_server.model, "prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200 and http.get("/health").status_code == 200


def test_constraints_that_leave_no_token_are_400_and_the_engine_survives(live_server, http):
    """allowed_token_ids=[eos] with min_tokens: refused up front. With a choice grammar (which
    never allows EOS first) the contradiction shows only while sampling: still a 400 for each of six
    concurrent requests (in-band in a stream), and the server keeps serving."""
    from concurrent.futures import ThreadPoolExecutor

    eos = live_server.tokenizer.eos_token_id
    body = {"model": live_server.model, "prompt": "Hi", "max_tokens": 3, "allowed_token_ids": [eos]}
    response = http.post("/v1/completions", json={**body, "min_tokens": 1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "allowed_token_ids"
    contradictory = {**body, "structured_outputs": {"choice": ["yes", "no"]}}
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda _: http.post("/v1/completions", json=contradictory), range(6)))
    for response in responses:
        assert response.status_code == 400, response.text
        assert "no token can be generated" in response.json()["error"]["message"]
    streamed = http.post("/v1/completions", json={**contradictory, "stream": True})
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert events[-1]["error"]["type"] == "invalid_request_error"
    assert "no token can be generated" in events[-1]["error"]["message"]
    ok = http.post("/v1/completions", json={"model": live_server.model, "prompt": "Hi", "max_tokens": 2,
                                            "ignore_eos": True})
    assert ok.status_code == 200 and http.get("/health").status_code == 200
