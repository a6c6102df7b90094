"""``--metrics-prefix vllm``: a live server's scrape has every series a default vLLM 0.32 server
exports, with vLLM's names, types, label sets and bucket edges, so what reads ``vllm:`` series
(autoscaling rules, gateways, vLLM's dashboards) reads kvserve unchanged.

The list is read from vLLM 0.32's source: ``vllm/v1/metrics/loggers.py``
(``PrometheusStatLogger.__init__``: the series created without LoRA, speculative decoding, a KV
connector, a watermark or ``VLLM_COMPUTE_NANS_IN_LOGITS``), ``vllm/v1/metrics/buckets.py`` (edges),
``vllm/v1/engine/__init__.py`` (``FINISH_REASON_STRINGS``), ``vllm/v1/metrics/stats.py``
(``PromptTokenStats.ALL_SOURCES``) and ``vllm/v1/metrics/cache_hit_source.py``.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvserve.testing.live_server import start_live_server

MODEL = "tiny-vllm-names"
ENGINE = ("model_name", "engine")
GAUGES = {"num_requests_running": (), "num_requests_waiting": (), "num_requests_waiting_by_reason": ("reason",),
          "engine_sleep_state": ("sleep_state",), "kv_cache_usage_perc": ()}
COUNTERS = {"prefix_cache_queries": (), "prefix_cache_hits": (), "external_prefix_cache_queries": (),
            "external_prefix_cache_hits": (), "mm_cache_queries": (), "mm_cache_hits": (), "num_preemptions": (),
            "prompt_tokens": (), "prompt_tokens_by_source": ("source",), "prompt_tokens_cached": (),
            "prompt_tokens_cached_by_source": ("source",), "generation_tokens": (),
            "request_success": ("finished_reason",)}
HISTOGRAMS = ("request_prompt_tokens", "request_generation_tokens", "iteration_tokens_total",
              "request_max_num_generation_tokens", "request_params_n", "request_params_max_tokens",
              "time_to_first_token_seconds", "inter_token_latency_seconds", "request_time_per_output_token_seconds",
              "e2e_request_latency_seconds", "request_queue_time_seconds", "request_inference_time_seconds",
              "request_prefill_time_seconds", "request_decode_time_seconds", "request_num_preemptions",
              "request_prefill_kv_computed_tokens")
LABEL_VALUES = {
    ("request_success", "finished_reason"): {"stop", "length", "abort", "error", "repetition"},
    ("prompt_tokens_by_source", "source"): {"local_compute", "local_cache_hit", "external_kv_transfer"},
    ("prompt_tokens_cached_by_source", "source"): {"device", "host", "p2p", "disk", "external_unspecified"},
    ("num_requests_waiting_by_reason", "reason"): {"capacity", "deferred"},
    ("engine_sleep_state", "sleep_state"): {"awake", "weights_offloaded", "discard_all"},
    ("admission_rejections", "reason"): {"max_num_queued_reqs", "max_num_queued_tokens"},
}
EDGES = {  # vLLM's bucket families
    "time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                                    10.0, 20.0, 40.0, 80.0],
    "e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                                    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
    "iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
    "request_params_n": [1, 2, 5, 10, 20],
    "request_num_preemptions": [1, 2, 3, 4, 5, 10, 20],
    "request_prompt_tokens": [1, 2, 5, 10, 20, 50, 100, 200],  # 1-2-5 up to max_model_len 256
}
EDGES["request_time_per_output_token_seconds"] = EDGES["inter_token_latency_seconds"]
for _name in ("request_queue_time_seconds", "request_inference_time_seconds", "request_prefill_time_seconds",
              "request_decode_time_seconds"):
    EDGES[_name] = EDGES["e2e_request_latency_seconds"]
# vLLM's CacheConfig fields (cache_config_info labels), of which kvserve exports the ones it has.
CACHE_CONFIG_FIELDS = {"block_size", "gpu_memory_utilization", "cache_dtype", "num_gpu_blocks_override",
                       "enable_prefix_caching", "num_gpu_blocks", "num_cpu_blocks", "kv_cache_memory_bytes",
                       "sliding_window", "prefix_caching_hash_algo"}


@pytest.fixture(scope="module")
def families(tiny_llama):
    server = start_live_server(str(tiny_llama), served_model_name=MODEL, api_key="k", max_model_len=256,
                               metrics_prefix="vllm")
    try:
        headers = {"Authorization": "Bearer k"}
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as client:
            for _ in range(2):  # the same 40-word prompt twice: the second finds the first's full blocks
                r = client.post("/v1/completions", json={"model": MODEL, "prompt": "again " * 40, "max_tokens": 3,
                                                         "ignore_eos": True})
                assert r.status_code == 200, r.text
            assert client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1}).status_code == 400
            assert client.get("/v1/models").status_code == 200 and client.get("/health").status_code == 200
            text = client.get("/metrics").text
    finally:
        server.stop()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _labels(family) -> set[str]:
    return {name for s in family.samples for name in s.labels if name != "le"}


@pytest.mark.parametrize("name, extra", [*GAUGES.items()])
def test_gauges(families, name, extra):
    family = families["vllm:" + name]
    assert family.type == "gauge" and _labels(family) == {*ENGINE, *extra}


@pytest.mark.parametrize("name, extra", [*COUNTERS.items()])
def test_counters(families, name, extra):
    family = families["vllm:" + name]
    assert family.type == "counter" and _labels(family) == {*ENGINE, *extra}
    assert all(s.name == family.name + "_total" for s in family.samples if not s.name.endswith("_created"))


@pytest.mark.parametrize("name", HISTOGRAMS)
def test_histograms(families, name):
    family = families["vllm:" + name]
    assert family.type == "histogram" and _labels(family) == set(ENGINE)
    if name in EDGES:
        edges = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
        assert edges == [*map(float, EDGES[name]), float("inf")]


def test_admission_rejections_has_vllms_labels(families):
    family = families["vllm:admission_rejections"]
    assert family.type == "counter" and _labels(family) == {"model_name", "reason"}


@pytest.mark.parametrize("family_name, label", list(LABEL_VALUES))
def test_label_values_exist_from_the_start(families, family_name, label):
    values = {s.labels[label] for s in families["vllm:" + family_name].samples}
    assert values == LABEL_VALUES[(family_name, label)]


def test_cache_config_info_uses_vllms_field_names(families):
    (sample,) = families["vllm:cache_config_info"].samples
    assert sample.value == 1 and set(sample.labels) - {"engine"} <= CACHE_CONFIG_FIELDS
    assert sample.labels["enable_prefix_caching"] == "True" and sample.labels["engine"] == "0"


def test_values_after_two_identical_prompts(families):
    def value(name, **labels):
        return sum(s.value for s in families["vllm:" + name].samples
                   if s.name == f"vllm:{name}_total" and labels.items() <= s.labels.items())

    assert value("request_success", finished_reason="length") == 2
    cached = value("prompt_tokens_by_source", source="local_cache_hit")
    computed = value("prompt_tokens_by_source", source="local_compute")
    assert computed + cached == value("prompt_tokens") and value("prompt_tokens_cached") == cached
    assert cached == value("prefix_cache_hits") > 0  # the second prompt found the first's blocks


def test_no_kvserve_names(families):
    assert not any(name.startswith("kvserve:") for name in families)


def test_http_series_per_route_as_vllms_instrumentator(families):
    """vLLM instruments its app with prometheus-fastapi-instrumentator (probes and /metrics left
    out): requests per route template, method and status class, and their durations."""
    requests = {(s.labels["handler"], s.labels["method"], s.labels["status"]): s.value
                for s in families["http_requests"].samples if s.name == "http_requests_total"}
    assert requests == {("/v1/completions", "POST", "2xx"): 2, ("/v1/completions", "POST", "4xx"): 1,
                        ("/v1/models", "GET", "2xx"): 1}
    durations = families["http_request_duration_seconds"]
    assert durations.type == "histogram" and _labels(durations) == {"handler", "method"}
    assert {"http_request_size_bytes", "http_response_size_bytes", "http_request_duration_highr_seconds"} <= set(families)
