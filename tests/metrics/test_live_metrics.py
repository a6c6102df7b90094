"""``GET /metrics`` of a real server (engine thread + uvicorn on loopback) against what clients saw.

The server runs at most 2 requests at once, so concurrent requests queue for hundreds of
milliseconds: TTFT is then dominated by engine time, and the server's TTFT sum can be compared
with the client's (the HTTP overhead of a few milliseconds is small beside it).
"""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvserve.testing.live_server import start_live_server
from metrics_helpers import parse_metrics

MODEL = "tiny-metrics"
BLOCK_SIZE = 16
REQUEST_HISTOGRAMS = ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                      "request_prefill_time_seconds", "request_decode_time_seconds",
                      "request_time_per_output_token_seconds", "request_prompt_tokens",
                      "request_generation_tokens")


@pytest.fixture(scope="module")
def server(tiny_llama):
    srv = start_live_server(str(tiny_llama), served_model_name=MODEL, api_key="k", max_model_len=256,
                            block_size=BLOCK_SIZE, num_gpu_blocks_override=256, max_num_seqs=2)
    srv.client = srv.make_client()
    yield srv
    srv.stop()


def scrape(srv) -> dict:
    response = httpx.get(srv.base_url + "/metrics", timeout=10)
    assert response.status_code == 200
    return parse_metrics(response.text)


def value(metrics: dict, name: str, **labels) -> float:
    return metrics.get((name, frozenset({"model_name": MODEL, "engine": "0", **labels}.items())), 0.0)


def delta(after: dict, before: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def random_prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 400) for _ in range(length)]


def stream_one(srv, prompt: list[int], max_tokens: int) -> tuple[float, dict]:
    """(client TTFT seconds, usage) of one streamed completion."""
    start = time.perf_counter()
    ttft = None
    usage = None
    for chunk in srv.client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ):
        if ttft is None and chunk.choices:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            usage = chunk.usage
    return ttft, usage


def test_streamed_requests_fill_histograms_and_counters(server):
    num_requests, max_tokens = 6, 24
    before = scrape(server)
    with ThreadPoolExecutor(num_requests) as pool:
        results = list(pool.map(lambda i: stream_one(server, random_prompt(i, 20 + i), max_tokens),
                                range(num_requests)))
    after = scrape(server)
    for name in REQUEST_HISTOGRAMS:
        assert delta(after, before, f"kvserve:{name}_count") == num_requests, name
    assert delta(after, before, "kvserve:request_success_total", finished_reason="length") == num_requests
    # one inter-token gap per token after the first
    assert delta(after, before, "kvserve:inter_token_latency_seconds_count") == num_requests * (max_tokens - 1)
    usages = [usage for _, usage in results]
    assert delta(after, before, "kvserve:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta(after, before, "kvserve:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta(after, before, "kvserve:request_prompt_tokens_sum") == sum(u.prompt_tokens for u in usages)
    client_ttft = sum(ttft for ttft, _ in results)
    server_ttft = delta(after, before, "kvserve:time_to_first_token_seconds_sum")
    # The server's interval (arrival -> first token out of the engine) lies inside the client's
    # (send -> first chunk read), so its sum is at most the client's; the client's adds HTTP and
    # its own threads, which on a busy 2-core machine can be most of a small TTFT, so the lower
    # bound only catches a wrong unit or a wrong start (a tenth of the client's).
    assert client_ttft / 10 <= server_ttft <= client_ttft * 1.02 + 0.01, (server_ttft, client_ttft)
    # queue + prefill = TTFT and TTFT + decode = e2e for every request, so the sums agree too
    parts = sum(delta(after, before, f"kvserve:request_{p}_time_seconds_sum") for p in ("queue", "prefill"))
    assert parts == pytest.approx(server_ttft, abs=1e-6)
    assert delta(after, before, "kvserve:request_queue_time_seconds_sum") > 0  # 6 requests, 2 slots


async def _open_and_drop(srv, num_streams: int) -> None:
    body = {"model": MODEL, "prompt": random_prompt(99, 30), "max_tokens": 225, "stream": True,
            "ignore_eos": True}
    headers = {"Authorization": "Bearer k"}
    async with httpx.AsyncClient(base_url=srv.base_url, headers=headers, timeout=30) as client:
        async def one() -> None:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for _ in response.aiter_bytes():
                    pass

        tasks = [asyncio.create_task(one()) for _ in range(num_streams)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            stats = srv.engine_stats()
            if stats["num_running"] + stats["num_waiting"] == num_streams:
                break
            await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_dropped_streams_are_counted_as_aborted_and_gauges_return_to_idle(server):
    idle = scrape(server)
    assert value(idle, "kvserve:num_requests_running") == 0
    asyncio.run(_open_and_drop(server, 40))
    deadline = time.monotonic() + 5
    while True:
        after = scrape(server)
        settled = (value(after, "kvserve:num_requests_running") == 0
                   and value(after, "kvserve:num_requests_waiting") == 0
                   and value(after, "kvserve:kv_cache_usage_perc") == value(idle, "kvserve:kv_cache_usage_perc")
                   and delta(after, idle, "kvserve:request_aborted_total") == 40)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert value(after, "kvserve:num_requests_running") == 0
    assert value(after, "kvserve:num_requests_waiting") == 0
    assert value(after, "kvserve:kv_cache_usage_perc") == value(idle, "kvserve:kv_cache_usage_perc")
    assert delta(after, idle, "kvserve:request_aborted_total") == 40


def _cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


def _completion_usage(srv, prompt, stream: bool):
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    if not stream:
        return srv.client.completions.create(**kwargs).usage
    chunks = srv.client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    return [c.usage for c in chunks if c.usage is not None][-1]


def _chat_usage(srv, text: str, stream: bool):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=2, temperature=0)
    if not stream:
        return srv.client.chat.completions.create(**kwargs).usage
    chunks = srv.client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    return [c.usage for c in chunks if c.usage is not None][-1]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_repeated_prompt_counts_prefix_cache_hits_and_usage_cached_tokens(server, endpoint, stream):
    seed = 1000 + 2 * (endpoint == "chat") + stream
    if endpoint == "completions":
        def send():
            return _completion_usage(server, random_prompt(seed, 53), stream)
    else:
        text = " ".join(f"w{random.Random(seed).randrange(10**6)}x{i}" for i in range(12))

        def send():
            return _chat_usage(server, text, stream)
    before = scrape(server)
    first = send()
    middle = scrape(server)
    second = send()
    after = scrape(server)
    expected = (first.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE  # full blocks, never the last token
    assert expected >= BLOCK_SIZE
    assert _cached(first) == 0 and delta(middle, before, "kvserve:prefix_cache_hits_total") == 0
    assert _cached(second) == expected
    assert delta(after, middle, "kvserve:prefix_cache_hits_total") == expected
    assert delta(after, middle, "kvserve:prefix_cache_queries_total") == second.prompt_tokens


def test_too_long_request_is_counted_as_rejected(server):
    before = scrape(server)
    response = httpx.post(server.base_url + "/v1/completions", headers={"Authorization": "Bearer k"},
                          json={"model": MODEL, "prompt": random_prompt(5, 300), "max_tokens": 10})
    assert response.status_code == 400
    after = scrape(server)
    assert delta(after, before, "kvserve:request_rejected_total", reason="invalid_request") == 1


def test_each_choice_of_n_counts_as_a_request(server):
    before = scrape(server)
    result = server.client.completions.create(model=MODEL, prompt=random_prompt(7, 21), max_tokens=5, n=2,
                                              temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    after = scrape(server)
    assert delta(after, before, "kvserve:request_success_total", finished_reason="length") == 2
    assert delta(after, before, "kvserve:e2e_request_latency_seconds_count") == 2
    assert delta(after, before, "kvserve:time_to_first_token_seconds_count") == 2
    # each choice prefills the prompt (vLLM's per-child counting); usage counts the prompt once
    assert delta(after, before, "kvserve:prompt_tokens_total") == 2 * result.usage.prompt_tokens
    assert delta(after, before, "kvserve:generation_tokens_total") == result.usage.completion_tokens == 10
    assert delta(after, before, "kvserve:inter_token_latency_seconds_count") == 2 * 4
