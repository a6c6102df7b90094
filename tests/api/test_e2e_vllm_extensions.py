"""vLLM request parameters over HTTP, on a float32 server so that greedy outputs can be checked
against transformers: allowed_token_ids, bad_words, truncate_prompt_tokens,
stream_options.continuous_usage_stats, echo with max_tokens=0 (prompt scoring), whole-call
admission of long prompt lists, and tools / tool_choice on chat."""

from __future__ import annotations

import json
import math
import threading
import time

import httpx
import pytest
import torch

from kvserve.testing.live_server import start_live_server
from kvserve.testing.reference import bad_words_ban, reference_greedy, single_token_word, vllm_bad_word_sequences
from kvserve.tokenizer import apply_chat_template

MAX_NUM_SEQS, MAX_NUM_WAITING = 4, 4
MESSAGES = [{"role": "user", "content": "Tell me about the fox"}]


@pytest.fixture(scope="module")
def server(tiny_llama):
    srv = start_live_server(str(tiny_llama), served_model_name="tiny-f32", api_key="k", dtype="float32",
                            max_model_len=512, block_size=16, num_gpu_blocks_override=256,
                            max_num_seqs=MAX_NUM_SEQS, max_num_waiting=MAX_NUM_WAITING)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def reference(tiny_llama):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60, headers={"Authorization": "Bearer k"}) as client:
        yield client


def completion(http, **body) -> dict:
    response = http.post("/v1/completions", json={"model": "tiny-f32", "temperature": 0, "ignore_eos": True, **body})
    assert response.status_code == 200, response.text
    return response.json()


def chat(http, **body) -> dict:
    response = http.post("/v1/chat/completions", json={"model": "tiny-f32", "temperature": 0, "ignore_eos": True,
                                                       "messages": MESSAGES, **body})
    assert response.status_code == 200, response.text
    return response.json()


def error(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    body = response.json()["error"]
    assert body["param"] == param and body["type"] == "invalid_request_error"
    return body["message"]


def sse(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    events = [e for e in response.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def wait_idle(server) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = server.engine_stats()
        if (stats["num_running"], stats["num_waiting"], stats["kv_cache_usage"]) == (0, 0, 0.0) \
                and server.engine.num_unfinished_requests == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"engine not idle: {server.engine_stats()}")


# -- allowed_token_ids ----------------------------------------------------------------------------

def test_allowed_token_ids_greedy_is_the_argmax_over_them(server, http, reference):
    tokenizer = server.tokenizer
    allowed = sorted(set(tokenizer.encode(" the cat sat on a mat", add_special_tokens=False)))
    banned = set(range(server.engine.vocab_size)) - set(allowed)
    prompt = tokenizer.encode("Once upon a time")
    out = completion(http, prompt=prompt, max_tokens=8, allowed_token_ids=allowed)
    expected = reference_greedy(reference, prompt, 8, lambda _: banned)
    assert out["choices"][0]["text"] == tokenizer.decode(expected)
    assert completion(http, prompt=prompt, max_tokens=8)["choices"][0]["text"] != out["choices"][0]["text"]
    chat_prompt = apply_chat_template(tokenizer, MESSAGES)
    reply = chat(http, max_tokens=8, allowed_token_ids=allowed)["choices"][0]["message"]["content"]
    assert reply == tokenizer.decode(reference_greedy(reference, chat_prompt, 8, lambda _: banned))


@pytest.mark.parametrize("value,needle", [([], "must not be empty"), ([5, 10**6], "out of the vocabulary"),
                                          ([-1], "integers >= 0")])
def test_allowed_token_ids_refused(http, value, needle):
    for path, extra in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": MESSAGES})):
        response = http.post(path, json={"model": "tiny-f32", "allowed_token_ids": value, **extra})
        assert needle in error(response, "allowed_token_ids")


# -- bad_words ------------------------------------------------------------------------------------

def test_bad_words_never_appear_while_they_would_without(server, http, reference):
    tokenizer = server.tokenizer
    prompt = tokenizer.encode("The quick brown fox")
    free = reference_greedy(reference, prompt, 16)
    assert completion(http, prompt="The quick brown fox", max_tokens=16)["choices"][0]["text"] == tokenizer.decode(free)
    _, word = single_token_word(tokenizer, free)
    sequences = vllm_bad_word_sequences(tokenizer, word)
    expected = reference_greedy(reference, prompt, 16, bad_words_ban(sequences))
    assert not set(expected) & {s[0] for s in sequences}
    out = completion(http, prompt="The quick brown fox", max_tokens=16, bad_words=[word], logprobs=0)
    assert out["choices"][0]["text"] == tokenizer.decode(expected)
    assert [t.strip() for t in out["choices"][0]["logprobs"]["tokens"]].count(word) == 0
    message = error(http.post("/v1/completions", json={"prompt": "hi", "bad_words": [""]}), "bad_words")
    assert "non-empty" in message


# -- truncate_prompt_tokens -----------------------------------------------------------------------

def test_truncate_prompt_tokens_equals_sending_the_kept_tokens(server, http):
    tokenizer = server.tokenizer
    prompt = tokenizer.encode("Once upon a time there was a little model that wanted to answer every question")
    assert len(prompt) > 12
    cut = completion(http, prompt=prompt, max_tokens=6, truncate_prompt_tokens=12, echo=True)
    kept = completion(http, prompt=prompt[-12:], max_tokens=6, echo=True)
    assert cut["choices"][0]["text"] == kept["choices"][0]["text"]
    assert cut["choices"][0]["text"].startswith(tokenizer.decode(prompt[-12:]))
    assert cut["usage"]["prompt_tokens"] == 12
    text = completion(http, prompt="Once upon a time there was a little model", max_tokens=4, truncate_prompt_tokens=5)
    assert text["usage"]["prompt_tokens"] == 5
    rendered = apply_chat_template(tokenizer, MESSAGES)
    reply = chat(http, max_tokens=6, truncate_prompt_tokens=7)
    assert reply["usage"]["prompt_tokens"] == 7
    assert reply["choices"][0]["message"]["content"] == completion(http, prompt=rendered[-7:], max_tokens=6)["choices"][0]["text"]
    assert completion(http, prompt=prompt, max_tokens=2, truncate_prompt_tokens=-1)["usage"]["prompt_tokens"] == len(prompt)
    for bad in (0, -2):  # -1 means the context length (vLLM)
        for path, extra in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": MESSAGES})):
            message = error(http.post(path, json={"truncate_prompt_tokens": bad, **extra}), "truncate_prompt_tokens")
            assert ">= 1" in message


# -- stream_options.continuous_usage_stats --------------------------------------------------------

def test_continuous_usage_counts_every_token_streamed_so_far(http):
    prompts = ["Once upon a time", "The quick brown fox jumps"]
    body = {"model": "tiny-f32", "prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0.8, "seed": 3,
            "ignore_eos": True, "logprobs": 0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = sse(http.post("/v1/completions", json=body))
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 4 * 6
    streamed = 0
    for chunk in chunks[:-1]:
        streamed += sum(len(c["logprobs"]["tokens"]) for c in chunk["choices"])
        usage = chunk["usage"]
        assert usage["prompt_tokens"] == final["usage"]["prompt_tokens"]
        assert usage["completion_tokens"] == streamed
        assert usage["total_tokens"] == usage["prompt_tokens"] + streamed
    assert chunks[-2]["usage"] == final["usage"]

    chat_body = {"model": "tiny-f32", "messages": MESSAGES, "max_tokens": 5, "ignore_eos": True, "logprobs": True,
                 "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = sse(http.post("/v1/chat/completions", json=chat_body))
    final = chunks[-1]["usage"]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[0]["usage"] == {**final, "completion_tokens": 0, "total_tokens": final["prompt_tokens"]}
    streamed = 0
    for chunk in chunks[1:-1]:
        streamed += sum(len((c.get("logprobs") or {}).get("content") or []) for c in chunk["choices"])
        assert chunk["usage"]["completion_tokens"] == streamed
    assert streamed == final["completion_tokens"] == 5 and chunks[-2]["usage"] == final


def test_usage_only_on_the_last_chunk_without_continuous_stats(http):
    body = {"model": "tiny-f32", "prompt": "Hi", "max_tokens": 3, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks = sse(http.post("/v1/completions", json=body))
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["usage"]["completion_tokens"] == 3
    body["stream_options"] = {"continuous_usage_stats": True}
    error(http.post("/v1/completions", json=body), "stream_options.continuous_usage_stats")


# -- echo with max_tokens=0 -----------------------------------------------------------------------

def test_echo_max_tokens_zero_scores_the_prompt(server, http, reference):
    tokenizer = server.tokenizer
    text = "Once upon a time there was a model"
    prompt = tokenizer.encode(text)
    out = completion(http, prompt=text, max_tokens=0, echo=True, logprobs=1)
    choice = out["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (text, "length")
    assert out["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 0, "total_tokens": len(prompt),
                            "prompt_tokens_details": {"cached_tokens": 0}}
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(prompt) and logprobs["token_logprobs"][0] is None
    with torch.no_grad():
        ref = torch.log_softmax(reference(torch.tensor([prompt])).logits[0].float(), dim=-1)
    for position in range(1, len(prompt)):
        assert math.isclose(logprobs["token_logprobs"][position], float(ref[position - 1, prompt[position]]),
                            abs_tol=1e-4)
        assert len(logprobs["top_logprobs"][position]) >= 1
    wait_idle(server)


def test_echo_max_tokens_zero_without_logprobs_runs_no_step(server, http):
    steps = server.core.make_stats().num_steps
    out = completion(http, prompt=["Hello there", "a fox"], n=2, max_tokens=0, echo=True, temperature=0.7)
    assert [(c["index"], c["text"], c["finish_reason"], c["logprobs"]) for c in out["choices"]] == [
        (0, "Hello there", "length", None), (1, "Hello there", "length", None),
        (2, "a fox", "length", None), (3, "a fox", "length", None)]
    ids = completion(http, prompt=[5, 6, 7], max_tokens=0, echo=True)
    assert ids["choices"][0]["text"] == server.tokenizer.decode([5, 6, 7])
    assert out["usage"]["completion_tokens"] == 0
    assert server.core.make_stats().num_steps == steps
    body = {"model": "tiny-f32", "prompt": "Hello there", "max_tokens": 0, "echo": True, "logprobs": 0,
            "stream": True}
    chunks = sse(http.post("/v1/completions", json=body))
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [("Hello there", "length")]
    wait_idle(server)


def test_max_tokens_zero_needs_echo(http):
    assert "echo" in error(http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 0}), "max_tokens")
    error(http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 0}), "max_tokens")
    error(http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_completion_tokens": 0}),
          "max_completion_tokens")
    error(http.post("/v1/completions", json={"prompt": "hi", "max_tokens": -1, "echo": True}), "max_tokens")


# -- admission of a whole call --------------------------------------------------------------------

def test_prompt_list_larger_than_the_queue_is_refused_whole(server, http):
    most = MAX_NUM_SEQS + MAX_NUM_WAITING
    for count in (3000, most + 1):
        message = error(http.post("/v1/completions", json={"prompt": [[5, 6, 7]] * count, "max_tokens": 2}), "prompt")
        assert f"needs {count} engine requests" in message and f"at most {most}" in message
        assert server.engine.num_unfinished_requests == 0 and server.engine_stats()["num_waiting"] == 0
    message = error(http.post("/v1/completions", json={"prompt": [[5, 6, 7]] * 3, "n": 3, "max_tokens": 2}), "prompt")
    assert "needs 9 engine requests" in message
    out = completion(http, prompt=[[5, 6, 7]] * most, max_tokens=2)
    assert len(out["choices"]) == most and out["usage"]["completion_tokens"] == 2 * most
    wait_idle(server)


def test_prompt_list_that_does_not_fit_now_is_429_and_queues_nothing(server, http):
    """With the engine full (4 running, 4 waiting), a 2-prompt call is refused whole."""
    body = {"model": "tiny-f32", "prompt": [5, 6, 7], "max_tokens": 500, "ignore_eos": True}
    results: list[int] = []

    def long_request() -> None:
        with httpx.Client(base_url=server.base_url, timeout=60, headers={"Authorization": "Bearer k"}) as client:
            results.append(client.post("/v1/completions", json=body).status_code)

    threads = [threading.Thread(target=long_request) for _ in range(MAX_NUM_SEQS + MAX_NUM_WAITING)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while server.engine_stats()["num_waiting"] < MAX_NUM_WAITING:
            assert time.monotonic() < deadline, server.engine_stats()
            time.sleep(0.005)
        response = http.post("/v1/completions", json={"prompt": [[8, 9], [10, 11]], "max_tokens": 2})
        assert response.status_code == 429 and response.json()["error"]["code"] == "queue_full"
        assert "this request adds 2" in response.json()["error"]["message"]
        assert server.engine.num_unfinished_requests == MAX_NUM_SEQS + MAX_NUM_WAITING
    finally:
        server.engine.abort_all("test over")
        for thread in threads:
            thread.join(timeout=30)
    assert len(results) == MAX_NUM_SEQS + MAX_NUM_WAITING
    wait_idle(server)


# -- tools / tool_choice --------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def test_tools_are_rendered_into_the_template(server, http):
    tokenizer = server.tokenizer
    with_tools = apply_chat_template(tokenizer, MESSAGES, tools=TOOLS)
    without = apply_chat_template(tokenizer, MESSAGES)
    assert len(with_tools) > len(without)
    out = chat(http, max_tokens=2, tools=TOOLS, tool_choice="none")
    assert out["usage"]["prompt_tokens"] == len(with_tools)
    assert out["choices"][0]["message"]["content"] is not None
    assert chat(http, max_tokens=2)["usage"]["prompt_tokens"] == len(without)
    tokenized = http.post("/tokenize", json={"model": "tiny-f32", "messages": MESSAGES, "tools": TOOLS}).json()
    assert tokenized["tokens"] == with_tools


@pytest.mark.parametrize("extra", [{}, {"tool_choice": "auto"}])
def test_auto_tool_choice_needs_the_parser_flags(http, extra):
    """As vLLM: tools without tool_choice mean "auto", which needs --enable-auto-tool-choice and
    --tool-call-parser (this server has neither)."""
    body = {"model": "tiny-f32", "messages": MESSAGES, "tools": TOOLS, **extra}
    message = error(http.post("/v1/chat/completions", json=body), "tool_choice")
    assert message.startswith('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')


def test_malformed_tools_are_400(http):
    for tools in ([{"type": "function"}], [{"type": "retrieval", "function": {"name": "x"}}]):
        response = http.post("/v1/chat/completions", json={"model": "tiny-f32", "messages": MESSAGES, "tools": tools})
        assert response.status_code == 400 and response.json()["error"]["param"].startswith("tools")
    response = http.post("/v1/chat/completions", json={"model": "tiny-f32", "messages": MESSAGES,
                                                       "tool_choice": "sometimes"})
    assert response.status_code == 400 and response.json()["error"]["param"].startswith("tool_choice")


# -- best_of --------------------------------------------------------------------------------------


def test_best_of_other_than_1_or_n_is_refused(http):
    """As vLLM V1: no server-side ranking of extra candidates; 1 or n (what clients send by
    default) is the plain n-choice request."""
    for best_of, n in ((1, 1), (1, 2), (2, 2)):
        out = completion(http, prompt="a b", max_tokens=2, n=n, best_of=best_of, temperature=0.7, seed=1)
        assert len(out["choices"]) == n
    for best_of, n in ((3, 1), (2, 1), (4, 2)):
        body = {"model": "tiny-f32", "prompt": "a b", "max_tokens": 2, "n": n, "best_of": best_of}
        message = error(http.post("/v1/completions", json=body), "best_of")
        assert f"best_of={best_of} is not supported" in message


# -- return_tokens_as_token_ids ---------------------------------------------------------------------


def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(server, http):
    """vLLM's field: logprobs name each token ``token_id:<id>``; the same request without it names
    them by text, and the ids are the tokens of that text."""
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "logprobs": 2, "echo": True}
    by_id = completion(http, return_tokens_as_token_ids=True, **body)["choices"][0]
    by_text = completion(http, **body)["choices"][0]
    ids = [int(t.removeprefix("token_id:")) for t in by_id["logprobs"]["tokens"]]
    assert all(t.startswith("token_id:") for t in by_id["logprobs"]["tokens"])
    assert ids[:3] == [5, 6, 7]
    assert server.tokenizer.decode(ids) == by_text["text"] == by_id["text"]
    assert by_id["logprobs"]["token_logprobs"] == by_text["logprobs"]["token_logprobs"]
    assert all(k.startswith("token_id:") for top in by_id["logprobs"]["top_logprobs"][1:] for k in top)
    out = chat(http, max_tokens=3, logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)
    entries = out["choices"][0]["logprobs"]["content"]
    assert len(entries) == 3 and all(e["token"].startswith("token_id:") for e in entries)
    assert all(e["top_logprobs"][0]["token"].startswith("token_id:") for e in entries)
