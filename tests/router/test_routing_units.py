"""Router parts on their own: the cache_aware cost formula and thresholds, the other policies,
the circuit breaker, the scaling rule, the prompt hashes (equal to a worker's), the registries."""

from __future__ import annotations

import math
import random

import pytest

from kvserve.errors import ConfigError
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.kv_events.wire import external_block_hash
from kvserve.request import Request
from kvserve.router.circuit_breaker import BreakerState, CircuitBreaker
from kvserve.router.config import RouterConfig, ScalingConfig
from kvserve.router.launcher import child_argv, core_shares
from kvserve.router.policies import RouteRequest, make_policy
from kvserve.router.prefix import ApproxPrefixIndex, hittable_blocks, request_block_hashes
from kvserve.router.registry import load_model_registry, load_worker_registry
from kvserve.router.scaling import ScalingInputs, SlidingWindow, desired_replicas
from kvserve.router.worker import KVEventsEndpoint, Worker
from kvserve.sampling_params import SamplingParams


def _worker(url: str, load: int = 0, cached: list[int] = ()) -> Worker:
    worker = Worker(url, healthy=True)
    worker.in_flight = load
    worker.approx_index.insert(list(cached))
    return worker


def test_prompt_hashes_equal_the_workers_block_hashes():
    tokens = [random.Random(1).randrange(1000) for _ in range(75)]
    manager = KVCacheManager(num_blocks=10, block_size=16)
    for salt in (None, "tenant-a"):
        request = Request.of("r", tokens, SamplingParams(), cache_salt=salt)
        manager.get_computed_blocks(request)  # fills request.block_hashes as the worker does
        assert request_block_hashes(tokens, 16, salt) == [external_block_hash(h) for h in request.block_hashes]
    assert len(request_block_hashes(tokens, 16)) == 4 and hittable_blocks(75, 16) == 4
    assert hittable_blocks(64, 16) == 3 and hittable_blocks(1, 16) == 0


def test_cache_aware_cost_prefers_the_cached_worker_until_the_queue_outweighs_it():
    policy = make_policy("cache_aware", RouterConfig(queue_token_cost=64))  # thresholds 0.3 / 64 / 1.5
    hashes = list(range(40))  # a 641-token prompt: 40 hittable blocks of 16
    request = RouteRequest(hashes, 641, 16)
    owner, other = _worker("http://a", load=3, cached=hashes[:32]), _worker("http://b", load=0)
    # cost(a) = (641 - 512) + 64 * 3 = 321 < cost(b) = 641 + 0
    decision = policy.select([owner, other], request)
    assert (decision.worker.url, decision.matched_tokens, decision.reason) == ("http://a", 512, "cache")
    owner.in_flight = 8  # 129 + 512 = 641 = cost(b): a tie goes to the lower load
    assert policy.select([owner, other], request).worker.url == "http://b"
    owner.in_flight = 7  # 129 + 448 = 577 < 641
    assert policy.select([owner, other], request).worker.url == "http://a"


def test_cache_aware_thresholds_send_by_load():
    config = RouterConfig(queue_token_cost=64)
    policy = make_policy("cache_aware", config)
    hashes = list(range(10))
    # 2 of 10 blocks cached = 32 / 161 tokens = 0.199 < 0.3: least load
    decision = policy.select([_worker("http://a", 2, hashes[:2]), _worker("http://b", 1)], RouteRequest(hashes, 161))
    assert (decision.worker.url, decision.reason) == ("http://b", "load")
    # imbalance: 100 - 30 > 64 and 100 > 1.5 * 30: least load even though a holds everything
    decision = policy.select([_worker("http://a", 100, hashes), _worker("http://b", 30)], RouteRequest(hashes, 161))
    assert (decision.worker.url, decision.reason) == ("http://b", "imbalance")
    # 100 - 40 = 60 <= 64: balanced, the cost decides (a: 1 + 64 * 100, b: 161 + 64 * 40)
    a, b = _worker("http://a", 100, hashes), _worker("http://b", 40)
    costs = {w.url: (161 - m) + 64 * w.load for w, m in ((a, 160), (b, 0))}
    assert policy.select([a, b], RouteRequest(hashes, 161)).worker.url == min(costs, key=costs.get)


def test_round_robin_least_load_and_power_of_two():
    workers = [_worker(f"http://w{i}", load) for i, load in enumerate((3, 1, 2))]
    rr = make_policy("round_robin", RouterConfig())
    assert [rr.select(workers, RouteRequest(None, 0)).worker.url for _ in range(4)] == \
        ["http://w0", "http://w1", "http://w2", "http://w0"]
    assert make_policy("least_load", RouterConfig()).select(workers, RouteRequest(None, 0)).worker.url == "http://w1"
    p2 = make_policy("power_of_two", RouterConfig(), random.Random(0))
    picks = {p2.select(workers, RouteRequest(None, 0)).worker.url for _ in range(50)}
    assert "http://w0" not in picks  # the most loaded one never wins a pair
    with pytest.raises(ValueError, match="known: cache_aware, least_load, least_ttft, power_of_two, round_robin"):
        make_policy("random", RouterConfig())


def test_circuit_breaker_opens_probes_and_closes():
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=3, open_seconds=5, clock=lambda: now[0])
    assert not breaker.record_failure() and not breaker.record_failure() and breaker.allows()
    assert breaker.record_failure() and breaker.state is BreakerState.OPEN and not breaker.allows()
    now[0] = 5.0
    assert breaker.allows() and breaker.state is BreakerState.HALF_OPEN
    breaker.on_attempt()
    assert not breaker.allows()  # one probe at a time
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN and not breaker.allows()
    now[0] = 10.0
    assert breaker.allows()
    breaker.on_attempt()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED and breaker.allows()
    assert breaker.record_failure(fatal=True) and breaker.state is BreakerState.OPEN  # a refused connection


def test_desired_replicas_rule():
    config = ScalingConfig(target_queue_per_replica=4, target_ttft_p90=2.0, target_kv_usage=0.8, max_replicas=16)
    assert desired_replicas(ScalingInputs(3, 30, None, 0.1), config) == 8  # ceil(3 * 30 / 12)
    assert desired_replicas(ScalingInputs(3, 0, 5.0, 0.1), config) == 8  # ceil(3 * 2.5)
    assert desired_replicas(ScalingInputs(2, 0, 1.0, 0.9), config) == 3  # ceil(2 * 1.125)
    assert desired_replicas(ScalingInputs(3, 12, 2.0, 0.8), config) == 3  # every ratio exactly 1
    assert desired_replicas(ScalingInputs(3, 0, None, 0.0), config) == 1  # idle: min_replicas
    assert desired_replicas(ScalingInputs(10, 1000, None, 0), config) == 16  # max_replicas


def test_sliding_window_percentiles_forget_old_values():
    now = [0.0]
    window = SlidingWindow(60, clock=lambda: now[0])
    for value in range(1, 101):
        window.add(float(value))
    assert (window.percentile(0.5), window.percentile(0.9), window.percentile(0.99)) == (50.0, 90.0, 99.0)
    now[0] = 61.0
    assert window.percentile(0.9) is None


def test_approximate_index_lru_and_ttl():
    now = [0.0]
    index = ApproxPrefixIndex(capacity=4, ttl=10, clock=lambda: now[0])
    index.insert([1, 2, 3])
    assert index.match_length([1, 2, 3, 4]) == 3 and index.match_length([2]) == 1
    index.insert([1, 5, 6])  # 7 entries would exceed 4: the least recently used (2, 3) go
    assert index.match_length([1, 2]) == 1 and index.match_length([1, 5, 6]) == 3
    now[0] = 10.5
    assert index.match_length([1]) == 0


def test_registries_and_their_errors(tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: a\n    version: '1'\n    weights: /w/a\n    quantization: null\n"
                      "    workers: [http://h:1]\n  - name: b\n    tokenizer: /t/b\n    block_size: 32\n")
    registry = load_model_registry(str(models))
    assert registry.find("a").tokenizer_path == "/w/a" and registry.find("b").block_size == 32
    models.write_text("models:\n  - name: a\n    wieghts: /w\n")
    with pytest.raises(ConfigError, match=r"models.0.wieghts: Extra inputs are not permitted"):
        load_model_registry(str(models))
    models.write_text("models:\n  - name: a\n  - name: a\n")
    with pytest.raises(ConfigError, match="distinct"):
        load_model_registry(str(models))
    workers = tmp_path / "workers.yaml"
    workers.write_text("workers:\n  - url: http://h:1\n    kv_events: tcp://h:5557\n  - url: http://h:2\n"
                       "    standby: true\n")
    entries = load_worker_registry(str(workers)).workers
    assert [(e.url, e.kv_events, e.standby) for e in entries] == [("http://h:1", "tcp://h:5557", False),
                                                                  ("http://h:2", None, True)]


def test_event_endpoint_forms():
    assert KVEventsEndpoint.parse("tcp://h:5557") == KVEventsEndpoint("tcp://h:5557", "tcp://h:5558")
    assert KVEventsEndpoint.parse("tcp://h:1,tcp://h:9") == KVEventsEndpoint("tcp://h:1", "tcp://h:9")
    assert KVEventsEndpoint.parse("ipc:///x/e") == KVEventsEndpoint("ipc:///x/e", None)
    assert KVEventsEndpoint.parse("ipc:///x/e,") == KVEventsEndpoint("ipc:///x/e", None)


def test_data_parallel_argv_and_core_shares():
    assert child_argv(["M", "-dp", "2", "--port=8000", "--host", "0.0.0.0", "--max-num-seqs", "8",
                       "--cpu-threads", "4"]) == ["M", "--max-num-seqs", "8"]
    assert core_shares(2, [0, 1, 2, 3, 4]) == [[0, 1, 2], [3, 4]]
    assert core_shares(3, [0, 1]) == [[0], [1], [0]]
    assert sum(map(len, core_shares(4, list(range(16))))) == 16 and math.prod(map(len, core_shares(4, list(range(16))))) == 256


def test_least_ttft_picks_the_lowest_predicted_ttft_and_falls_back_to_load():
    from kvserve.router.monitor import parse_worker_metrics

    text = ('kvserve:slo_predicted_ttft_seconds{model_name="m"} 0.8\n'
            'kvserve:slo_step_cost_seconds{model_name="m",term="step"} 0.04\n'
            'kvserve:slo_step_cost_seconds{model_name="m",term="prefill_token"} 0.0005\n'
            'kvserve:num_requests_running{model_name="m",engine="0"} 3\n')
    load = parse_worker_metrics(text)
    assert (load.predicted_ttft, load.prefill_token_cost, load.running) == (0.8, 0.0005, 3.0)
    slow, fast, busy = (_worker(f"http://w{i}") for i in range(3))
    slow.load_snapshot.predicted_ttft, fast.load_snapshot.predicted_ttft, busy.load_snapshot.predicted_ttft = 2.0, 0.5, 0.45
    for worker in (slow, fast, busy):
        worker.load_snapshot.prefill_token_cost = 0.001
    busy.in_flight = 1  # one request sent since its scrape: +128 prompt tokens = +0.128 s
    policy = make_policy("least_ttft", RouterConfig())
    decision = policy.select([slow, fast, busy], RouteRequest(None, 1128))
    assert decision.worker is fast and decision.reason == "ttft"
    assert policy.predicted_ttft(fast, 1128) == pytest.approx(1.5)  # 0.5 + 1000 tokens x 1 ms
    assert policy.predicted_ttft(busy, 1128) == pytest.approx(1.578)
    slow.load_snapshot.predicted_ttft = None  # a worker without a prediction: least load
    assert policy.select([slow, fast, busy], RouteRequest(None, 10)).reason == "load"
