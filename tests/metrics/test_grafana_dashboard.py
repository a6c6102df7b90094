"""The shipped Grafana dashboard (``docs/grafana/kvserve.json``) against a live server.

Every PromQL expression of the dashboard is evaluated (``promql.Evaluator``: Prometheus's
semantics over two scrapes, one before and one after a mixed load: streamed and non-streamed
completions and chat, ``n=2``, a request without ``max_tokens``) and must return at least one
series, every value finite (no NaN from an empty histogram or 0/0), and, for expressions over
counters and histograms, at least one value > 0. Checked too: the panels and queries are vLLM's
(``vllm-project/vllm``, ``examples/observability/prometheus_grafana/grafana.json`` at 4b5c627,
prefix renamed) plus kvserve's two, and the queries of vLLM's previous dashboard
(``examples/online_serving/prometheus_grafana/grafana.json`` at 004f771, which charts the
deprecated ``time_per_output_token_seconds`` and ``gpu_cache_usage_perc``) work unchanged as well.
All of it runs twice: against ``kvserve:`` series (the default) and, with ``--metrics-prefix vllm``,
against ``vllm:`` series with the queries as vLLM ships them.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import httpx
import pytest

from kvserve.testing.live_server import start_live_server
from promql import Evaluator, label_values, parse_scrape

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "kvserve.json"
MODEL = "tiny-dash"
VLLM_PANELS = ["E2E Request Latency", "Token Throughput", "Inter Token Latency", "Scheduler State",
               "Time To First Token Latency", "Cache Utilization", "Request Prompt Length",
               "Request Generation Length", "Finish Reason", "Queue Time", "Requests Prefill and Decode Time",
               "Max Generation Token in Sequence Group"]
KVSERVE_PANELS = ["Tokens per Engine Step", "Request Parameters"]
SEL = '{model_name="$model_name"}'
# vLLM's previous dashboard: the queries that differ from the current one (its TPOT panel and its
# cache panel), written here with the prefix renamed.
PREVIOUS_VLLM_QUERIES = [
    *(f"histogram_quantile({q}, sum by(le) (rate(kvserve:time_per_output_token_seconds_bucket{SEL}"
      "[$__rate_interval])))" for q in ("0.99", "0.95", "0.9", "0.5")),
    f"rate(kvserve:time_per_output_token_seconds_sum{SEL}[$__rate_interval])\n/\n"
    f"rate(kvserve:time_per_output_token_seconds_count{SEL}[$__rate_interval])",
    f"kvserve:gpu_cache_usage_perc{SEL}",
]


def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in doc["panels"] for target in panel["targets"]]


def test_dashboard_is_vllms_with_the_prefix_renamed():
    doc = json.loads(DASHBOARD.read_text())
    assert [p["title"] for p in doc["panels"]] == VLLM_PANELS + KVSERVE_PANELS
    queries = [expr for _, expr in dashboard_queries()]
    assert len(queries) == 32 and not any("vllm:" in q for q in queries)
    assert all(f"{SEL}" in q for q in queries)
    # a few of vLLM's queries verbatim but for the prefix
    assert ("histogram_quantile(0.99, sum by(le) (rate(kvserve:e2e_request_latency_seconds_bucket"
            '{model_name="$model_name"}[$__rate_interval])))') in queries
    assert 'sum by(finished_reason) (increase(kvserve:request_success_total{model_name="$model_name"}' \
           '[$__rate_interval]))' in queries
    variable = doc["templating"]["list"][1]
    assert variable["query"]["query"] == 'label_values({__name__=~"kvserve:.*"},model_name)'


def _chat(client, **kwargs):
    return client.post("/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "hello there"}], **kwargs})


@pytest.fixture(scope="module", params=["kvserve", "vllm"])
def scrapes(request, tiny_llama):
    server = start_live_server(str(tiny_llama), served_model_name=MODEL, api_key="dash-key", max_model_len=256,
                               max_num_seqs=4, metrics_prefix=request.param)
    try:
        headers = {"Authorization": "Bearer dash-key"}
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=120) as client:
            before, t0 = parse_scrape(client.get("/metrics").text), time.monotonic()
            for i in range(3):
                r = client.post("/v1/completions", json={"model": MODEL, "prompt": f"request {i} says",
                                                         "max_tokens": 6 + i, "ignore_eos": True})
                assert r.status_code == 200, r.text
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": "two of", "max_tokens": 5, "n": 2,
                                                     "stream": True})
            assert r.status_code == 200 and "[DONE]" in r.text
            assert _chat(client, max_tokens=4).status_code == 200
            assert _chat(client, max_completion_tokens=3, stream=True).status_code == 200
            assert _chat(client).status_code == 200  # no max_tokens: the rest of the context
            time.sleep(0.05)
            after, t1 = parse_scrape(client.get("/metrics").text), time.monotonic()
    finally:
        server.stop()
    return before, after, t1 - t0, request.param


def _named(expr: str, prefix: str) -> str:
    return expr.replace("kvserve:", prefix + ":")


@pytest.mark.parametrize("title, expr", dashboard_queries() + [("vLLM's previous dashboard", q)
                                                                for q in PREVIOUS_VLLM_QUERIES])
def test_every_dashboard_query_returns_data(scrapes, title, expr):
    before, after, seconds, prefix = scrapes
    result = Evaluator(before, after, seconds).evaluate(_named(expr, prefix).replace("$model_name", MODEL))
    assert isinstance(result, dict) and result, f"{title}: no series for {expr}"
    values = list(result.values())
    assert all(math.isfinite(v) for v in values), f"{title}: {result}"
    if "rate(" in expr or "increase(" in expr:
        assert max(values) > 0, f"{title}: {result}"


def test_model_name_variable_lists_the_served_model(scrapes):
    _, after, _, prefix = scrapes
    assert label_values(after, prefix + ":.*", "model_name") == {MODEL}
    assert label_values(after, prefix + ":.*", "engine") == {"0"}


def test_request_parameters_match_what_was_sent(scrapes):
    """Exact counts: 7 HTTP requests, 8 choices (one had n=2); max_tokens observed per choice."""
    before, after, seconds, prefix = scrapes
    ev = Evaluator(before, after, seconds)

    def increase(name: str) -> float:
        (value,) = ev.evaluate(f'increase({prefix}:{name}{{model_name="{MODEL}"}}[5m])').values()
        return value

    assert increase("request_params_n_count") == 7 and increase("request_params_n_sum") == 8
    assert increase("request_max_num_generation_tokens_count") == 7
    success = ev.evaluate(f'sum(increase({prefix}:request_success_total{{model_name="{MODEL}"}}[5m]))')
    assert list(success.values()) == [8]
    # the request without max_tokens is given the rest of the context by the API layer
    assert increase("request_params_max_tokens_count") == 8
    assert increase("request_params_max_tokens_sum") >= 6 + 7 + 8 + 2 * 5 + 4 + 3
