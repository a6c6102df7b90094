"""Pooling requests in the Prometheus series, as vLLM counts them: each input is a request that
finishes with ``stop`` (vLLM's scheduler: a pooled output is FINISHED_STOPPED), its prompt tokens
are counted, and the route is counted in ``http_requests_total``."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvserve.testing.live_server import start_live_server


def scrape(http: httpx.Client) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(http.get("/metrics").text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, items), v in samples.items() if n == name and labels.items() <= dict(items).items())


def test_embedding_inputs_are_requests_that_stop(bert_cls):
    server = start_live_server(str(bert_cls), served_model_name="emb", api_key="k")
    try:
        with httpx.Client(base_url=server.base_url, headers={"Authorization": "Bearer k"}, timeout=60) as http:
            response = http.post("/v1/embeddings", json={"model": "emb", "input": ["one two", "three four five"]})
            assert response.status_code == 200, response.text
            deadline = time.monotonic() + 10  # the engine thread counts a step just after handing it out
            while value(samples := scrape(http), "kvserve:request_success_total") < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        server.stop()
    assert value(samples, "kvserve:request_success_total", finished_reason="stop") == 2
    assert value(samples, "kvserve:request_success_total", finished_reason="length") == 0
    assert value(samples, "kvserve:prompt_tokens_total") == response.json()["usage"]["prompt_tokens"]
    assert value(samples, "kvserve:generation_tokens_total") == 0
    assert value(samples, "http_requests_total", handler="/v1/embeddings", status="2xx") == 1
