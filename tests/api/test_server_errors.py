"""Error shapes and statuses of the real app on loopback: 400 (ours, pydantic's, the engine's),
401, 404, 429 with Retry-After, 503, and a generic 500."""

from __future__ import annotations

import httpx
import openai
import pytest

from kvserve.api.settings import ServerSettings
from kvserve.testing.tokenizer_kinds import build_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("bpe")


def assert_error(response: httpx.Response, status: int, param=None, code=None, type=None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert error["message"] and error["param"] == param and error["code"] == code
    if type is not None:
        assert error["type"] == type
    return error


def test_bad_parameters_are_400(tokenizer):
    with LoopbackServer(ScriptedEngine(tokenizer)) as srv, httpx.Client(base_url=srv.base_url) as http:
        assert_error(http.post("/v1/completions", json={"prompt": "x", "temperature": -1}), 400,
                     param="temperature", type="invalid_request_error")
        error = assert_error(http.post("/v1/completions", json={"prompt": "x", "n": "many"}), 400, param="n")
        assert "n" in error["message"]
        assert_error(http.post("/v1/completions", json={}), 400, param="prompt")
        assert_error(http.post("/v1/completions", content=b"{not json",
                               headers={"content-type": "application/json"}), 400)
        assert_error(http.post("/v1/completions", json={"prompt": "x", "logit_bias": {"x1": 5}}), 400,
                     param="logit_bias")
        assert_error(http.post("/v1/completions", json={"prompt": "x", "logit_bias": {"99999": 5}}), 400,
                     param="logit_bias")
        assert_error(http.post("/v1/completions", json={"prompt": [5, 10**7]}), 400, param="prompt")
        assert_error(http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}),
            400, param="response_format")
        assert_error(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x"}}]}]}), 400,
            param="messages.0.content.0.type")
        assert srv.engine.calls == []  # nothing reached the engine
        assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_context_overflow_is_400_with_numbers(tokenizer):
    engine = ScriptedEngine(tokenizer, max_model_len=64)
    with LoopbackServer(engine) as srv, httpx.Client(base_url=srv.base_url) as http:
        prompt_ids = list(range(10, 138))  # twice the context
        error = assert_error(http.post("/v1/completions", json={"prompt": prompt_ids, "stream": True}),
                             400, param="prompt")
        assert "64" in error["message"] and "128" in error["message"]
        error = assert_error(http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x" * 400}]}), 400, param="messages")
        assert "64" in error["message"]
        assert engine.calls == []
        # As vLLM 0.32: a prompt and a max_tokens that do not fit together are a 400, in its words.
        error = assert_error(http.post("/v1/completions", json={"prompt": [5] * 60, "max_tokens": 10}), 400,
                             param="prompt")
        assert error["message"] == (
            "This model's maximum context length is 64 tokens. However, you requested 10 output tokens and your "
            "prompt contains 60 input tokens, for a total of 70 tokens. Please reduce the length of the input prompt "
            "or the number of requested output tokens.")
        error = assert_error(http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 65}), 400,
            param="max_completion_tokens")
        assert error["message"] == ("max_completion_tokens=65 cannot be greater than max_model_len=64. Please "
                                    "request fewer output tokens.")
        assert engine.calls == []
        chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert chat.status_code == 200  # chat without a cap: what the context leaves
        assert engine.calls[-1][2].max_tokens == 64 - len(engine.calls[-1][1])
        ok = http.post("/v1/completions", json={"prompt": [5] * 10, "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


def test_engine_errors_map_to_status(tokenizer):
    engine = ScriptedEngine(tokenizer)
    with LoopbackServer(engine) as srv, httpx.Client(base_url=srv.base_url) as http:
        engine.reject_reason = "queue_full"
        response = http.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert_error(response, 429, code="queue_full")
        assert response.headers["retry-after"] == "1"
        engine.reject_reason = "shutting_down"
        assert_error(http.post("/v1/completions", json={"prompt": "x"}), 503, code="shutting_down")
        engine.reject_reason = None
        engine.ready = False
        assert_error(http.get("/health"), 503, code="engine_not_ready")
        assert_error(http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}),
                     503, code="engine_not_ready")
        engine.ready = True
        assert http.get("/health").status_code == 200
        assert srv.state.in_flight == 0


def test_unexpected_error_is_generic_500(tokenizer):
    class BrokenEngine(ScriptedEngine):
        async def add_requests(self, requests):
            raise RuntimeError("secret internal detail")

    with LoopbackServer(BrokenEngine(tokenizer)) as srv, httpx.Client(base_url=srv.base_url) as http:
        error = assert_error(http.post("/v1/completions", json={"prompt": "x"}), 500, type="server_error")
        assert "secret" not in error["message"]
        assert srv.state.in_flight == 0


def test_auth_401_and_open_paths(tokenizer):
    settings = ServerSettings(api_keys=("key-one", "key-two"))
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        assert_error(http.get("/v1/models"), 401, code="invalid_api_key")
        assert_error(http.post("/v1/completions", json={"prompt": "x"},
                               headers={"Authorization": "Bearer wrong-key-123"}), 401, code="invalid_api_key")
        assert_error(http.post("/tokenize", json={"prompt": "x"}), 401, code="invalid_api_key")
        for path in ("/health", "/version", "/metrics"):
            assert http.get(path).status_code == 200
        for key in ("key-one", "key-two"):
            ok = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=key, max_retries=0)
            assert ok.models.list().data[0].id == "scripted-model"
        bad = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="scripted-model", prompt="x")


def test_unknown_model_404(tokenizer):
    settings = ServerSettings(served_model_name="my-model")
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv:
        api = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError) as info:
            api.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
        assert info.value.body["code"] == "model_not_found"
        assert api.completions.create(model="my-model", prompt="x", max_tokens=2).model == "my-model"
        assert [m.id for m in api.models.list().data] == ["my-model"]


def test_rate_limits_429_with_retry_after(tokenizer):
    settings = ServerSettings(api_keys=("a", "b"), requests_per_minute=2, tokens_per_minute=10_000)
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        headers = {"Authorization": "Bearer a"}
        for _ in range(2):
            assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=headers).status_code == 200
        response = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=headers)
        assert_error(response, 429, code="rate_limit_exceeded", type="requests")
        assert 1 <= int(response.headers["retry-after"]) <= 30
        other = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                          headers={"Authorization": "Bearer b"})
        assert other.status_code == 200
        too_big = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 200, "n": 60},
                            headers={"Authorization": "Bearer b"})
        assert_error(too_big, 429, code="rate_limit_exceeded", type="tokens")
        assert too_big.headers["retry-after"] == "60"
