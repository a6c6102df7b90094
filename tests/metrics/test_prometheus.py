"""PrometheusStatsLogger and SchedulerStatsCollector fed hand-made stats objects (exact values)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvserve.engine.output_processor import RequestTimes
from kvserve.errors import InvalidRequestError, RequestRejectedError
from kvserve.metrics.buckets import REQUEST_LATENCY_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS, request_tokens_buckets
from kvserve.metrics.prometheus import (PrometheusStatsLogger, SchedulerStatsCollector, metric_prefix,
                                        rejection_reason)
from kvserve.metrics.stats import IterationStats
from kvserve.scheduler.stats import SchedulerStats
from metrics_helpers import make_state, parse_metrics, sample

M = {"model_name": "m", "engine": "0"}


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def metrics(registry):
    return PrometheusStatsLogger("m", 100, registry)


def test_token_buckets_1_2_5_up_to_max_model_len():
    assert request_tokens_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert request_tokens_buckets(4) == [1, 2]
    # vLLM 0.32's families (vllm/v1/metrics/buckets.py): first and last edges and lengths
    assert (TIME_TO_FIRST_TOKEN_BUCKETS[0], TIME_TO_FIRST_TOKEN_BUCKETS[-1], len(TIME_TO_FIRST_TOKEN_BUCKETS)) == \
        (0.001, 2560.0, 22)
    assert (REQUEST_LATENCY_BUCKETS[0], REQUEST_LATENCY_BUCKETS[-1], len(REQUEST_LATENCY_BUCKETS)) == (0.3, 7680.0, 21)


def test_metric_prefix_must_be_a_prometheus_name():
    assert metric_prefix("vllm") == "vllm:"
    for bad in ("", "9x", "a:b", "a-b"):
        with pytest.raises(ValueError, match="--metrics-prefix"):
            metric_prefix(bad)


def test_iteration_counts_tokens_ttft_and_itl(registry, metrics):
    metrics.on_step(None, [], IterationStats(7, 3, [0.5], [0.01, 0.2]))
    metrics.on_step(None, [], IterationStats(0, 2, [], [0.03]))
    assert sample(registry, "kvserve:prompt_tokens_total", **M) == 7
    assert sample(registry, "kvserve:generation_tokens_total", **M) == 5
    assert sample(registry, "kvserve:time_to_first_token_seconds_count", **M) == 1
    assert sample(registry, "kvserve:time_to_first_token_seconds_sum", **M) == pytest.approx(0.5)
    assert sample(registry, "kvserve:inter_token_latency_seconds_count", **M) == 3
    assert sample(registry, "kvserve:inter_token_latency_seconds_sum", **M) == pytest.approx(0.24)
    # vLLM's ITL edges: 0.01 falls in le=0.01, 0.03 in le=0.05, 0.2 in le=0.2
    assert sample(registry, "kvserve:inter_token_latency_seconds_bucket", le="0.01", **M) == 1
    assert sample(registry, "kvserve:inter_token_latency_seconds_bucket", le="0.025", **M) == 1
    assert sample(registry, "kvserve:inter_token_latency_seconds_bucket", le="0.05", **M) == 2
    assert sample(registry, "kvserve:inter_token_latency_seconds_bucket", le="0.2", **M) == 3


def test_iteration_tokens_per_step_that_ran_and_deprecated_tpot_twin(registry, metrics):
    ran = object()  # the step's StepStats: only whether a step ran matters here
    metrics.on_step(ran, [], IterationStats(7, 3, [0.5], [0.01, 0.2]))
    metrics.on_step(ran, [], IterationStats(0, 2, [], [0.03, 0.03]))
    metrics.on_step(None, [], IterationStats())  # nothing ran: no iteration observed
    # vLLM's iteration_tokens_total: computed prompt + generation tokens of the step's IterationStats
    assert sample(registry, "kvserve:iteration_tokens_total_count", **M) == 2
    assert sample(registry, "kvserve:iteration_tokens_total_sum", **M) == 12
    assert sample(registry, "kvserve:iteration_tokens_total_bucket", le="1.0", **M) == 0
    assert sample(registry, "kvserve:iteration_tokens_total_bucket", le="8.0", **M) == 1
    assert sample(registry, "kvserve:iteration_tokens_total_bucket", le="16.0", **M) == 2
    # vLLM's deprecated time_per_output_token_seconds holds the per-token ITL observations
    for suffix in ("_count", "_sum", "_bucket"):
        labels = {"le": "0.05"} if suffix == "_bucket" else {}
        assert sample(registry, "kvserve:time_per_output_token_seconds" + suffix, **labels, **M) == \
            sample(registry, "kvserve:inter_token_latency_seconds" + suffix, **labels, **M)
    assert sample(registry, "kvserve:time_per_output_token_seconds_count", **M) == 4
    assert sample(registry, "kvserve:time_per_output_token_seconds_sum", **M) == pytest.approx(0.27)


def test_request_parameters_once_per_request_and_max_tokens_per_choice(registry, metrics):
    two = make_state("a", choices=[("length", 4, RequestTimes(100.0, 100.2, 100.8, 100.8, 100.1)),
                                   ("stop", 1, RequestTimes(100.0, 100.3, 100.3, 100.3, 100.1))])
    one = make_state("b", choices=[("stop", 9, RequestTimes(100.0, 100.2, 100.9, 100.9, 100.1))])
    metrics.on_step(None, [two, one], None)  # both asked max_tokens=16
    assert sample(registry, "kvserve:request_params_n_count", **M) == 2
    assert sample(registry, "kvserve:request_params_n_sum", **M) == 3
    assert sample(registry, "kvserve:request_params_n_bucket", le="1.0", **M) == 1
    assert sample(registry, "kvserve:request_params_n_bucket", le="2.0", **M) == 2
    # the longest choice of each request: 4 and 9
    assert sample(registry, "kvserve:request_max_num_generation_tokens_count", **M) == 2
    assert sample(registry, "kvserve:request_max_num_generation_tokens_sum", **M) == 13
    assert sample(registry, "kvserve:request_max_num_generation_tokens_bucket", le="5.0", **M) == 1
    # max_tokens per finished choice (3 choices)
    assert sample(registry, "kvserve:request_params_max_tokens_count", **M) == 3
    assert sample(registry, "kvserve:request_params_max_tokens_sum", **M) == 48
    # inference = first scheduled -> finished = prefill + decode
    assert sample(registry, "kvserve:request_inference_time_seconds_sum", **M) == pytest.approx(0.7 + 0.2 + 0.8)


def test_max_tokens_none_is_not_observed(registry, metrics):
    state = make_state("c")
    state.params.max_tokens = None
    metrics.on_step(None, [state], None)
    assert sample(registry, "kvserve:request_params_max_tokens_count", **M) == 0
    assert sample(registry, "kvserve:request_params_n_count", **M) == 1


def test_finished_requests_fill_histograms_per_choice(registry, metrics):
    state = make_state(num_prompt=5, choices=[
        ("length", 4, RequestTimes(100.0, 100.2, 100.8, 100.8, 100.1)),
        ("stop", 1, RequestTimes(100.0, 100.3, 100.3, 100.3, 100.1)),
    ])
    metrics.on_step(None, [state], None)
    assert sample(registry, "kvserve:request_success_total", finished_reason="length", **M) == 1
    assert sample(registry, "kvserve:request_success_total", finished_reason="stop", **M) == 1
    assert sample(registry, "kvserve:request_success_total", finished_reason="abort", **M) == 0
    expected_sums = {
        "e2e_request_latency_seconds": 0.8 + 0.3, "request_queue_time_seconds": 0.1 + 0.1,
        "request_prefill_time_seconds": 0.1 + 0.2, "request_decode_time_seconds": 0.6 + 0.0,
        "request_time_per_output_token_seconds": 0.2 + 0.0,
        "request_prompt_tokens": 10, "request_generation_tokens": 5,
    }
    for name, total in expected_sums.items():
        assert sample(registry, f"kvserve:{name}_count", **M) == 2, name
        assert sample(registry, f"kvserve:{name}_sum", **M) == pytest.approx(total), name
    assert sample(registry, "kvserve:request_generation_tokens_bucket", le="1.0", **M) == 1
    assert sample(registry, "kvserve:request_generation_tokens_bucket", le="5.0", **M) == 2


def test_aborted_and_rejected_with_reason(registry, metrics):
    metrics.on_request_aborted("a")
    metrics.on_request_aborted("b")
    metrics.count_rejected("queue_full")
    metrics.count_rejected("invalid_request")
    metrics.count_rejected("invalid_request")
    # engine refusals are counted by the HTTP layer (once), not here
    metrics.on_request_rejected(RequestRejectedError("full", reason="queue_full"))
    assert sample(registry, "kvserve:request_aborted_total", **M) == 2
    assert sample(registry, "kvserve:request_rejected_total", reason="queue_full", **M) == 1
    assert sample(registry, "kvserve:request_rejected_total", reason="invalid_request", **M) == 2


def test_rejection_reason_of_engine_errors():
    assert rejection_reason(RequestRejectedError("full", reason="queue_full")) == "queue_full"
    assert rejection_reason(InvalidRequestError("too long", param="prompt")) == "invalid_request"
    assert rejection_reason(RuntimeError("x")) == "error"


def test_scheduler_collector_reads_the_latest_snapshot(registry):
    snapshots = [SchedulerStats(num_running=3, num_waiting=2, kv_cache_usage=0.25, prefix_cache_queries=64,
                                prefix_cache_hits=32, num_preemptions=4)]
    registry.register(SchedulerStatsCollector("m", lambda: snapshots[-1]))
    values = parse_metrics(generate_latest(registry).decode())
    m = frozenset(M.items())
    assert values[("kvserve:num_requests_running", m)] == 3
    assert values[("kvserve:num_requests_waiting", m)] == 2
    assert values[("kvserve:kv_cache_usage_perc", m)] == 0.25
    assert values[("kvserve:gpu_cache_usage_perc", m)] == 0.25  # vLLM's deprecated name, same value
    assert values[("kvserve:prefix_cache_queries_total", m)] == 64
    assert values[("kvserve:prefix_cache_hits_total", m)] == 32
    assert values[("kvserve:num_preemptions_total", m)] == 4
    snapshots.append(SchedulerStats())
    values = parse_metrics(generate_latest(registry).decode())
    assert values[("kvserve:num_requests_running", m)] == 0 and values[("kvserve:kv_cache_usage_perc", m)] == 0


def test_exposed_names_are_exactly_the_issue_names(registry, metrics):
    registry.register(SchedulerStatsCollector("m", SchedulerStats))
    text = generate_latest(registry).decode()
    names = {s.split("{")[0] for s in text.splitlines() if s and not s.startswith("#")}
    for counter in ("prompt_tokens_total", "generation_tokens_total", "prefix_cache_queries_total",
                    "prefix_cache_hits_total", "num_preemptions_total", "request_success_total",
                    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert "kvserve:" + counter in names, counter
    assert not any(n.endswith("_total_total") for n in names)
    # every sample carries vLLM's label set: model_name and engine (admission_rejections: no engine)
    samples = [s for s in text.splitlines() if s and not s.startswith("#")]
    assert all('model_name="m"' in s and ('engine="0"' in s or s.startswith("kvserve:admission_rejections"))
               for s in samples)


def test_prompt_tokens_by_source_and_cached(registry, metrics):
    ran = object()
    metrics.on_step(ran, [], IterationStats(20, 3, [0.5], [], num_cached_prompt_tokens=16))
    metrics.on_step(ran, [], IterationStats(7, 1, [0.5], []))
    assert sample(registry, "kvserve:prompt_tokens_total", **M) == 27
    assert sample(registry, "kvserve:prompt_tokens_by_source_total", source="local_compute", **M) == 11
    assert sample(registry, "kvserve:prompt_tokens_by_source_total", source="local_cache_hit", **M) == 16
    assert sample(registry, "kvserve:prompt_tokens_by_source_total", source="external_kv_transfer", **M) == 0
    assert sample(registry, "kvserve:prompt_tokens_cached_total", **M) == 16
    # iteration_tokens_total counts what was computed: (20 - 16) + 3, then 7 + 1
    assert sample(registry, "kvserve:iteration_tokens_total_sum", **M) == 15


def test_preemptions_and_computed_prefill_per_finished_choice(registry, metrics):
    state = make_state(num_prompt=40, choices=[("stop", 3, RequestTimes(100.0, 100.5, 101.0, 101.5, 100.25)),
                                               ("error", 0, RequestTimes(100.0, None, None, 100.7, 100.25))])
    state.choices["0_r"].num_preemptions = 3
    state.num_cached_tokens = 32
    metrics.on_step(None, [state], None)
    assert sample(registry, "kvserve:request_num_preemptions_count", **M) == 2
    assert sample(registry, "kvserve:request_num_preemptions_sum", **M) == 3
    assert sample(registry, "kvserve:request_num_preemptions_bucket", le="1.0", **M) == 1
    assert sample(registry, "kvserve:request_num_preemptions_bucket", le="3.0", **M) == 2
    assert sample(registry, "kvserve:request_prefill_kv_computed_tokens_sum", **M) == 16
    assert sample(registry, "kvserve:request_success_total", finished_reason="error", **M) == 1
    assert sample(registry, "kvserve:request_success_total", finished_reason="repetition", **M) == 0


def test_a_full_queue_is_vllms_admission_rejection(registry, metrics):
    metrics.count_rejected("queue_full")
    metrics.count_rejected("rate_limited")
    assert sample(registry, "kvserve:admission_rejections_total", model_name="m", reason="max_num_queued_reqs") == 1
    assert sample(registry, "kvserve:admission_rejections_total", model_name="m", reason="max_num_queued_tokens") == 0


def test_waiting_by_reason_sleep_state_and_absent_caches(registry):
    registry.register(SchedulerStatsCollector("m", lambda: SchedulerStats(num_waiting=5, num_deferred=2,
                                                                          prefix_cache_hits=48), "vllm:"))
    values = parse_metrics(generate_latest(registry).decode())
    m = frozenset(M.items())
    assert values[("vllm:num_requests_waiting_by_reason", m | {("reason", "capacity")})] == 3
    assert values[("vllm:num_requests_waiting_by_reason", m | {("reason", "deferred")})] == 2
    assert values[("vllm:engine_sleep_state", m | {("sleep_state", "awake")})] == 1
    assert values[("vllm:engine_sleep_state", m | {("sleep_state", "discard_all")})] == 0
    assert values[("vllm:prompt_tokens_cached_by_source_total", m | {("source", "device")})] == 48
    assert values[("vllm:prompt_tokens_cached_by_source_total", m | {("source", "host")})] == 0
    assert values[("vllm:external_prefix_cache_hits_total", m)] == 0
    assert not any(name.startswith("kvserve:") for name, _ in values)


def test_two_registries_do_not_clash():
    a, b = CollectorRegistry(), CollectorRegistry()
    PrometheusStatsLogger("m", 16, a).on_request_aborted("x")
    PrometheusStatsLogger("m", 16, b)
    assert sample(a, "kvserve:request_aborted_total", **M) == 1
    assert sample(b, "kvserve:request_aborted_total", **M) == 0
