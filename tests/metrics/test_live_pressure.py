"""Metrics under pressure on a real server with a tiny KV cache (7 usable blocks of 16 tokens) and a
waiting queue of 2: preemptions and queue-full refusals are counted."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvserve.testing.live_server import start_live_server
from metrics_helpers import parse_metrics

MODEL = "tiny-pressure"


@pytest.fixture(scope="module")
def server(tiny_llama):
    srv = start_live_server(str(tiny_llama), served_model_name=MODEL, api_key="k", max_model_len=128,
                            block_size=16, num_gpu_blocks_override=8, max_num_seqs=4, max_num_waiting=2)
    srv.client = srv.make_client()
    yield srv
    srv.stop()


def scrape(srv) -> dict:
    return parse_metrics(httpx.get(srv.base_url + "/metrics", timeout=10).text)


def delta(after: dict, before: dict, name: str, **labels) -> float:
    key = (name, frozenset({"model_name": MODEL, "engine": "0", **labels}.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def complete(srv, seed: int):
    prompt = [(seed * 37 + i * 11) % 300 + 50 for i in range(20)]
    return srv.client.completions.create(model=MODEL, prompt=prompt, max_tokens=76, temperature=0,
                                         extra_body={"ignore_eos": True}).usage


def test_preemption_counter_matches_the_scheduler(server):
    before = scrape(server)
    preemptions_before = server.core.scheduler.num_preemptions
    # two requests of 96 tokens (6 blocks each) cannot both hold their blocks in 7
    with ThreadPoolExecutor(2) as pool:
        usages = list(pool.map(lambda seed: complete(server, seed), (1, 2)))
    after = scrape(server)
    preempted = server.core.scheduler.num_preemptions - preemptions_before
    assert preempted >= 1
    assert delta(after, before, "kvserve:num_preemptions_total") == preempted
    # recomputing a preempted prompt does not count its tokens twice
    assert delta(after, before, "kvserve:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta(after, before, "kvserve:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta(after, before, "kvserve:request_success_total", finished_reason="length") == 2


async def _burst(srv, num_requests: int) -> list[int]:
    headers = {"Authorization": "Bearer k"}
    async with httpx.AsyncClient(base_url=srv.base_url, headers=headers, timeout=60) as client:
        async def one(seed: int) -> int:
            body = {"model": MODEL, "prompt": [seed + 60] * 20, "max_tokens": 60, "ignore_eos": True}
            return (await client.post("/v1/completions", json=body)).status_code

        return await asyncio.gather(*(one(seed) for seed in range(num_requests)))


def test_queue_full_refusals_are_counted_with_their_reason(server):
    before = scrape(server)
    statuses = asyncio.run(_burst(server, 10))
    after = scrape(server)
    refused = statuses.count(429)
    assert refused >= 4  # at most 4 running + 2 waiting while the first ones run
    assert statuses.count(200) == 10 - refused
    assert delta(after, before, "kvserve:request_rejected_total", reason="queue_full") == refused
    assert delta(after, before, "kvserve:request_success_total", finished_reason="length") == 10 - refused
