"""vLLM v1's output semantics over HTTP (the table in docs/api.md): ``stop_reason``, ``usage``
and ``logprobs`` as the JSON shows them, streamed and not, ``n`` with ``seed``, the default
``max_tokens``. Tokens are forced as in ``tests/engine/test_vllm_semantics.py``:
``allowed_token_ids`` leaves `` world`` and one other token, ``logit_bias`` makes that one the
argmax and ``min_tokens`` holds it back for two tokens.

vLLM's facts (its source): ``usage.completion_tokens`` is the sum of ``len(token_ids)`` over the
choices, the stop token included (``serving.py`` of completions and chat); completion logprobs
list every token id of the choice, the stop token included; ``stop_reason`` is the stop string,
the stop token id, or null for the EOS and for ``length``; completions default to
``max_tokens`` 16 and chat to what the context leaves (``get_max_tokens``).
"""

from __future__ import annotations

import json

import httpx
import pytest

HELLO, WORLD, EOS, IM_END = 813, 902, 1, 3
MODEL = "tiny-llama"
MAX_MODEL_LEN = 256  # the live_server fixture's


@pytest.fixture
def http(live_server):
    with httpx.Client(base_url=live_server.base_url, timeout=120,
                      headers={"Authorization": "Bearer test-key"}) as client:
        yield client


def forced(last: int, **body) -> dict:
    return {"model": MODEL, "temperature": 0, "allowed_token_ids": [WORLD, last],
            "logit_bias": {str(last): 100}, "min_tokens": 2, "max_tokens": 8, **body}


def post(http, path: str, body: dict) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def stream_chunks(http, path: str, body: dict) -> list[dict]:
    response = http.post(path, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200, response.text
    events = [line[len("data: "):] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_completion_stop_token_id(http):
    """The stop token counts in usage and logprobs; its text is not in ``text``."""
    body = post(http, "/v1/completions", forced(HELLO, prompt="The fox", stop_token_ids=[HELLO], logprobs=0))
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (" world world", "stop", HELLO)
    assert choice["logprobs"]["tokens"] == [" world", " world", "Hello"]
    assert len(choice["logprobs"]["token_logprobs"]) == 3
    assert body["usage"]["completion_tokens"] == 3


def test_completion_eos_has_null_stop_reason(http):
    body = post(http, "/v1/completions", forced(EOS, prompt="The fox", logprobs=0, skip_special_tokens=False))
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (" world world", "stop", None)
    assert "stop_reason" in choice
    assert choice["logprobs"]["tokens"] == [" world", " world", "<|endoftext|>"]
    assert body["usage"]["completion_tokens"] == 3


def test_completion_length_has_null_stop_reason(http):
    body = post(http, "/v1/completions", forced(EOS, prompt="The fox", max_tokens=2))
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (" world world", "length", None)
    assert body["usage"]["completion_tokens"] == 2


def test_completion_stop_string_streamed_and_not(http):
    """``"world world"`` ends in the second token: the text is ``" "``, both tokens count, and
    no streamed chunk ever shows part of the stop string."""
    request = forced(WORLD, prompt="The fox", min_tokens=0, stop=["world world"], logprobs=0)
    choice = post(http, "/v1/completions", request)["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (" ", "stop", "world world")
    assert choice["logprobs"]["tokens"] == [" world", " world"]
    chunks = stream_chunks(http, "/v1/completions", request)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert "".join(texts) == " " and not any("w" in t for t in texts)
    last = [c["choices"][0] for c in chunks if c["choices"]][-1]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", "world world")
    assert chunks[-1]["usage"]["completion_tokens"] == 2


def test_chat_generation_config_eos(http):
    """Chat ends at ``<|im_end|>`` (generation_config's EOS): ``stop_reason`` is its id, the
    content never shows it, it counts in usage and its logprob is the last one."""
    body = post(http, "/v1/chat/completions", forced(
        IM_END, messages=[{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=0,
        skip_special_tokens=False))
    choice = body["choices"][0]
    assert choice["message"]["content"] == " world world"
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", IM_END)
    assert [entry["token"] for entry in choice["logprobs"]["content"]] == [" world", " world", "<|im_end|>"]
    assert body["usage"]["completion_tokens"] == 3


def test_n_with_seed_is_seed_plus_index(http):
    """Choice ``i`` of ``n=2, seed=s`` equals a lone request with ``seed=s+i``."""
    base = {"model": MODEL, "prompt": "The fox", "max_tokens": 8, "temperature": 1.0, "ignore_eos": True,
            "logprobs": 0}
    both = post(http, "/v1/completions", {**base, "n": 2, "seed": 11})
    for i, choice in enumerate(both["choices"]):
        alone = post(http, "/v1/completions", {**base, "seed": 11 + i})["choices"][0]
        assert choice["index"] == i
        assert choice["text"] == alone["text"]
        assert choice["logprobs"]["token_logprobs"] == alone["logprobs"]["token_logprobs"]
    assert both["choices"][0]["text"] != both["choices"][1]["text"]
    assert both["usage"]["completion_tokens"] == 16


def test_default_max_tokens(http):
    """Completions without ``max_tokens`` generate 16; chat generates what the context leaves."""
    body = post(http, "/v1/completions", {"model": MODEL, "prompt": "The fox", "ignore_eos": True})
    assert (body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"]) == (16, "length")
    body = post(http, "/v1/chat/completions", {"model": MODEL, "ignore_eos": True,
                                               "messages": [{"role": "user", "content": "Hi"}]})
    usage = body["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN
    assert body["choices"][0]["finish_reason"] == "length"


def test_min_tokens_above_what_the_context_leaves_is_400(http):
    """Chat without a cap may generate what the context leaves; a ``min_tokens`` above that is a
    400 (vLLM builds its ``SamplingParams`` with that cap)."""
    messages = [{"role": "user", "content": "the fox " * 20}]
    left = MAX_MODEL_LEN - post(http, "/tokenize", {"model": MODEL, "messages": messages})["count"]
    response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "min_tokens": left + 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "min_tokens" and f"cuts to {left} " in error["message"]
