"""``use_beam_search`` over HTTP (completions and chat), as vLLM 0.32 serves it: the beam width
is ``n``, the choices are the best sequences best first, the same as ``LLM.beam_search`` gives
offline; vLLM's refusals (streamed completions, ``echo`` with ``logprobs``) and kvserve's (a field
beam search would ignore, a beam wider than 10) are 400s naming the field."""

from __future__ import annotations

import json

import httpx
import pytest

from kvserve.beam_search import BeamSearchParams
from kvserve.testing.live_server import start_live_server

MODEL = "tiny-beams"
PROMPT = "a beam search over"


@pytest.fixture(scope="module")
def server(tiny_llama):
    srv = start_live_server(str(tiny_llama), served_model_name=MODEL, api_key="k", max_model_len=128,
                            dtype="float32")
    srv.http = httpx.Client(base_url=srv.base_url, headers={"Authorization": "Bearer k"}, timeout=120)
    yield srv
    srv.http.close()
    srv.stop()


@pytest.fixture(scope="module")
def offline(tiny_llama):
    from kvserve import LLM

    llm = LLM(str(tiny_llama), max_model_len=128, dtype="float32")
    (out,) = llm.beam_search(PROMPT, BeamSearchParams(beam_width=3, max_tokens=5))
    prompt_len = len(llm.get_tokenizer().encode(PROMPT))
    return [seq.tokens[prompt_len:] for seq in out.sequences], llm.get_tokenizer()


def test_completions_equal_the_offline_search(server, offline):
    expected, tokenizer = offline
    r = server.http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "n": 3, "max_tokens": 5,
                                                  "use_beam_search": True, "return_token_ids": True,
                                                  "logprobs": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["token_ids"] for c in body["choices"]] == expected
    assert [c["text"] for c in body["choices"]] == [tokenizer.decode(ids) for ids in expected]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == sum(len(ids) for ids in expected)
    for choice in body["choices"]:
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(choice["token_ids"])
        assert all(len(top) in (2, 3) for top in logprobs["top_logprobs"])  # top 2 + the chosen token (as vLLM)
    # the best beam has the highest score: its summed logprobs are the largest of equal-length beams
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in body["choices"]]
    assert sums == sorted(sums, reverse=True)


def test_chat_streams_the_beams_as_one_chunk_each(server):
    r = server.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 4,
        "use_beam_search": True, "stream": True})
    assert r.status_code == 200, r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    finishes = {c["index"]: c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]}
    assert set(finishes) == {0, 1} and set(finishes.values()) <= {"length", "stop"}
    plain = server.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 4,
        "use_beam_search": True}).json()
    streamed = {i: "".join(c["delta"].get("content") or "" for e in events for c in e["choices"] if c["index"] == i)
                for i in (0, 1)}
    assert [streamed[i] for i in (0, 1)] == [c["message"]["content"] for c in plain["choices"]]


@pytest.mark.parametrize("body, param, words", [
    ({"stream": True}, "stream", "Streaming is not currently supported with beam search"),
    ({"echo": True, "logprobs": 1}, "echo", "`echo` with `logprobs` is not supported with beam search"),
    ({"top_p": 0.5}, "top_p", "top_p is not supported with use_beam_search"),
    ({"stop": ["x"]}, "stop", "stop is not supported with use_beam_search"),
    ({"seed": 0}, "seed", "seed is not supported with use_beam_search"),
    ({"n": 11}, "n", "n must be at most 10 with use_beam_search"),
    ({"n": 0}, "n", "n must be an integer >= 1, got 0"),
    ({"max_tokens": 0, "echo": True}, "max_tokens", "max_tokens must be >= 1 with use_beam_search"),
])
def test_refusals_name_the_field(server, body, param, words):
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "use_beam_search": True, **body}
    r = server.http.post("/v1/completions", json=request)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_chat_refuses_a_forced_tool_call(server):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = server.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "use_beam_search": True,
        "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


def test_the_engine_is_idle_after_a_search(server):
    r = server.http.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "n": 2, "max_tokens": 3,
                                                  "use_beam_search": True})
    assert r.status_code == 200
    stats = server.engine_stats()
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
