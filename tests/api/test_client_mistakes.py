"""Property: no client mistake produces a 5xx. Random request bodies (hypothesis) hit the real
app on loopback; every answer is 200 or a 4xx with the OpenAI error shape."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve.testing.tokenizer_kinds import build_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.integers(-3, 40), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=6)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "robot"]),
                                 "content": st.one_of(st.text(max_size=10), VALUES)})
COMMON = ["model", "n", "max_tokens", "temperature", "top_p", "stop", "seed", "logit_bias",
          "presence_penalty", "frequency_penalty", "stream", "stream_options", "response_format",
          "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
          "prompt_logprobs", "priority", "cache_salt"]
COMPLETION_ONLY = ["prompt", "echo", "logprobs", "suffix"]
CHAT_ONLY = ["messages", "max_completion_tokens", "logprobs", "top_logprobs", "continue_final_message"]


def body_for(keys: list[str]):
    value_for = {"prompt": st.one_of(st.text(max_size=12), st.lists(st.integers(-5, 2000), max_size=5), VALUES),
                 "messages": st.one_of(st.lists(MESSAGE, max_size=3), VALUES),
                 "model": st.sampled_from(["scripted-model", "other"]),
                 "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["1", "x", "-2", "99999"]),
                                                         st.integers(-200, 200), max_size=2), VALUES)}
    return st.dictionaries(st.sampled_from(keys), VALUES, max_size=6).flatmap(
        lambda base: st.fixed_dictionaries({k: value_for.get(k, VALUES) for k in base}))


@pytest.fixture(scope="module")
def server():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"), max_model_len=64)) as srv:
        yield srv


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n") and '"error"' not in response.text
    else:
        json.loads(response.text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(completion=body_for(COMMON + COMPLETION_ONLY), chat=body_for(COMMON + CHAT_ONLY))
def test_random_bodies_never_5xx(server, completion, chat):
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        check(http.post("/v1/completions", json=completion))
        check(http.post("/v1/chat/completions", json=chat))
    assert server.state.in_flight == 0


@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"null", b"{", b'{"prompt": NaN}', b"\xff\xfe"])
def test_malformed_json_is_400(server, raw):
    with httpx.Client(base_url=server.base_url) as http:
        response = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_unknown_route_and_method_use_error_shape(server):
    with httpx.Client(base_url=server.base_url) as http:
        missing = http.get("/v1/nothing")
        assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
        wrong = http.get("/v1/completions")
        assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0, "echo": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
])
def test_prompt_logprobs_with_stream_is_400(server, path, body):
    """A streamed response has no field for prompt_logprobs: they were silently dropped (and
    computed for nothing). vLLM refuses a value > 0 with stream=True; 0 stays allowed."""
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        base = {"model": "scripted-model", "stream": True, **body}
        refused = http.post(path, json={**base, "prompt_logprobs": 2})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "prompt_logprobs"
        check(http.post(path, json={**base, "prompt_logprobs": 0}))
        assert http.post(path, json={**base, "prompt_logprobs": 0}).status_code == 200
    assert server.state.in_flight == 0
