"""The router's request path against scripted workers on loopback: byte-for-byte streams and
X-Request-Id, retries before the first byte, in-band errors after it, client mistakes passed
back, keys and rate limits, routing by model, drain, the warm pool, the scaling gauges."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from fake_worker import STREAM_CHUNKS, FakeWorker
from fleet_helpers import free_port, wait_for

from kvserve.router.app import Router, build_router_app
from kvserve.router.config import HealthConfig, RouterConfig
from kvserve.router.launcher import build_router, build_tokenizers


class RouterThread:
    def __init__(self, config: RouterConfig):
        import uvicorn

        self.router = build_router(config)
        self.url = f"http://127.0.0.1:{config.port}"
        self.server = uvicorn.Server(uvicorn.Config(build_router_app(self.router), host="127.0.0.1",
                                                    port=config.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_for(lambda: self.server.started, 20, "router started")
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


def _config(workers, **kwargs) -> RouterConfig:
    health = HealthConfig(interval=0.2, timeout=1.0, load_interval=0.2, cb_open_seconds=60)
    return RouterConfig(host="127.0.0.1", port=free_port(), worker_urls=tuple(w.url for w in workers),
                        health=health, **kwargs)


def _metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_stream_passes_byte_for_byte_with_the_request_id():
    with FakeWorker("a") as worker, RouterThread(_config([worker], policy="round_robin")) as router:
        with httpx.stream("POST", router.url + "/v1/completions", headers={"X-Request-Id": "client-7"},
                          json={"model": "m", "prompt": "hi", "stream": True}) as response:
            body = b"".join(response.iter_raw())
            assert response.headers["x-request-id"] == "client-7"
            assert response.headers["content-type"].startswith("text/event-stream")
        assert body == b"".join(STREAM_CHUNKS)
        assert worker.seen[0]["x-request-id"] == "client-7"
        plain = httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "hi"})
        assert plain.json() == {"worker": "a", "model": "m"} and len(plain.headers["x-request-id"]) == 32
        assert plain.headers["content-length"] == str(len(plain.content))
        # one kept connection to the worker served both
        assert len({seen["client_port"] for seen in worker.seen}) == 1 and len(worker.seen) == 2
        assert httpx.get(router.url + "/v1/completions").status_code == 405


def test_a_client_that_leaves_mid_stream_closes_the_worker_connection():
    with FakeWorker("a", mode="endless") as worker, RouterThread(_config([worker])) as router:
        wait_for(lambda: router.router.fleet.get(worker.url).healthy, 10, "healthy")
        with httpx.stream("POST", router.url + "/v1/completions",
                          json={"model": "m", "prompt": "x", "stream": True}) as response:
            assert next(response.iter_raw()).startswith(STREAM_CHUNKS[0])
        wait_for(lambda: worker.stream_ended == "client_left", 10, "the worker saw its client leave")
        wait_for(lambda: _metric(router.url, 'kvserve_router_requests_total{outcome="client_disconnected"') == 1,
                 10, "counted")
        assert router.router.fleet.get(worker.url).in_flight == 0
        assert router.router.fleet.get(worker.url).breaker.state.value == "closed"


def test_5xx_and_refused_connections_are_retried_on_another_worker():
    dead_port = free_port()  # nothing listens there
    with FakeWorker("bad", status=503) as bad, FakeWorker("good") as good:
        config = _config([bad, good], policy="round_robin")
        config = RouterConfig(**{**config.__dict__, "worker_urls": (f"http://127.0.0.1:{dead_port}", bad.url, good.url)})
        with RouterThread(config) as router:
            wait_for(lambda: router.router.fleet.get(bad.url).healthy and router.router.fleet.get(good.url).healthy,
                     10, "fake workers healthy")
            answers = [httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": str(i)}).json()
                       for i in range(6)]
            assert answers == [{"worker": "good", "model": "m"}] * 6
            assert _metric(router.url, 'kvserve_router_retries_total{reason="status_5xx"}') >= 1
            workers = httpx.get(router.url + "/workers").json()["workers"]
            assert not next(w for w in workers if w["url"].endswith(str(dead_port)))["healthy"]


def test_last_workers_error_is_passed_back_when_every_try_fails():
    with FakeWorker("bad", status=503) as bad, RouterThread(_config([bad])) as router:
        wait_for(lambda: router.router.fleet.get(bad.url).healthy, 10, "healthy")
        response = httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert response.status_code == 503 and response.json()["error"]["message"] == "bad failed"
        # three 5xx in a row open its breaker (cb_failure_threshold 3): the fourth try finds no worker
        assert len(bad.seen) == 3
        assert httpx.get(router.url + "/workers").json()["workers"][0]["breaker"] == "open"


def test_client_mistakes_are_not_retried():
    with FakeWorker("strict", status=400) as worker, RouterThread(_config([worker])) as router:
        wait_for(lambda: router.router.fleet.get(worker.url).healthy, 10, "healthy")
        response = httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"})
        assert response.status_code == 400 and len(worker.seen) == 1
        bad_json = httpx.post(router.url + "/v1/completions", content=b"{not json",
                              headers={"content-type": "application/json"})
        assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "invalid_request_error"


def test_a_stream_broken_after_its_first_byte_ends_with_an_in_band_error():
    with FakeWorker("flaky", mode="break") as worker, RouterThread(_config([worker])) as router:
        wait_for(lambda: router.router.fleet.get(worker.url).healthy, 10, "healthy")
        with httpx.stream("POST", router.url + "/v1/completions",
                          json={"model": "m", "prompt": "x", "stream": True}) as response:
            assert response.status_code == 200
            body = b"".join(response.iter_raw())
        assert body.startswith(STREAM_CHUNKS[0])
        events = body[len(STREAM_CHUNKS[0]):].split(b"\n\n")
        assert b'"code": "worker_failed"' in events[0] and events[1] == b"data: [DONE]"
        assert _metric(router.url, 'kvserve_router_requests_total{outcome="stream_error"') == 1


def test_keys_rate_limits_and_unknown_models():
    with FakeWorker("a", model="m") as worker:
        config = _config([worker], api_keys=("sk-1",), requests_per_minute=1)
        with RouterThread(config) as router:
            wait_for(lambda: router.router.fleet.get(worker.url).model == "m", 10, "model learned")
            assert httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"}).status_code == 401
            auth = {"Authorization": "Bearer sk-1"}
            missing = httpx.post(router.url + "/v1/completions", json={"model": "nope", "prompt": "x"}, headers=auth)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
            assert httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"},
                              headers=auth).status_code == 200
            limited = httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"}, headers=auth)
            assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limit_exceeded"
            assert "retry-after" in limited.headers
            assert httpx.get(router.url + "/health").status_code == 200  # open paths need no key


def test_model_registry_routes_by_model_and_lists_models(tmp_path):
    with FakeWorker("a", model="alpha") as a, FakeWorker("b", model="beta") as b:
        from kvserve.builtin import builtin_model_path

        weights = str(builtin_model_path())
        registry = tmp_path / "models.yaml"
        registry.write_text(f"models:\n  - name: alpha\n    version: '3'\n    weights: {weights}\n"
                            f"    quantization: int8\n    workers: [{a.url}]\n"
                            f"  - name: beta\n    workers: [{b.url}]\n")
        config = RouterConfig(**{**_config([]).__dict__, "model_registry": str(registry)})
        with RouterThread(config) as router:
            wait_for(lambda: all(w.healthy for w in router.router.fleet.workers.values()), 10, "healthy")
            models = httpx.get(router.url + "/v1/models").json()["data"]
            assert [(m["id"], m["version"], m["quantization"], m["root"]) for m in models] == \
                [("alpha", "3", "int8", weights), ("beta", None, None, None)]
            for model, name in (("alpha", "a"), ("beta", "b"), ("beta", "b"), ("alpha", "a")):
                assert httpx.post(router.url + "/v1/completions",
                                  json={"model": model, "prompt": "x"}).json()["worker"] == name
            assert httpx.get(router.url + "/v1/models/gamma").status_code == 404


def test_drain_waits_for_in_flight_then_removes_and_add_brings_back():
    with FakeWorker("slow", mode="hold") as worker, RouterThread(_config([worker])) as router:
        wait_for(lambda: router.router.fleet.get(worker.url).healthy, 10, "healthy")
        result = {}
        thread = threading.Thread(target=lambda: result.update(
            r=httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=30)))
        thread.start()
        wait_for(lambda: worker.seen, 10, "request at the worker")
        drained = {}
        drainer = threading.Thread(target=lambda: drained.update(
            r=httpx.delete(router.url + "/workers/" + worker.url, timeout=30)))
        drainer.start()
        wait_for(lambda: router.router.fleet.get(worker.url).state == "draining", 10, "draining")
        assert httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "y"}).status_code == 503
        worker.release.set()
        thread.join(10)
        drainer.join(10)
        assert result["r"].status_code == 200 and drained["r"].json() == {"url": worker.url, "drained": True,
                                                                           "in_flight_left": 0}
        assert httpx.get(router.url + "/workers").json()["workers"] == []
        added = httpx.post(router.url + "/workers", json={"url": worker.url})
        assert added.status_code == 201 and added.json()["healthy"] and added.json()["model"] == "m"
        assert httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "z"}).status_code == 200


def test_standby_is_promoted_when_the_active_worker_dies_and_gauges_are_exported():
    active, standby = FakeWorker("active"), FakeWorker("standby")
    with active, standby:
        config = RouterConfig(**{**_config([active]).__dict__, "standby_workers": (standby.url,)})
        with RouterThread(config) as router:
            fleet = router.router.fleet
            wait_for(lambda: fleet.get(active.url).healthy and fleet.get(standby.url).healthy, 10, "healthy")
            assert httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"}).json()["worker"] \
                == "active"
            text = httpx.get(router.url + "/metrics").text
            for name in ("kvserve_router_desired_replicas 1.0", "kvserve_router_active_replicas 1.0",
                         "kvserve_router_standby_replicas 1.0", 'kvserve_router_prefix_cache_hit_rate{policy='):
                assert name in text
            active.server.should_exit = True
            active.thread.join(10)
            wait_for(lambda: fleet.get(standby.url).state == "active", 10, "standby promoted")
            assert httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "x"}).json()["worker"] \
                == "standby"
            assert _metric(router.url, "kvserve_router_ejections_total") >= 1


def test_a_worker_that_refuses_with_429_is_retried_on_another_worker():
    """A kvserve worker refuses a request whose latency targets it predicts to miss (429
    slo_unattainable) before anything is sent: the router tries another worker."""
    with FakeWorker("full", status=429) as full, FakeWorker("free") as free:
        with RouterThread(_config([full, free], policy="round_robin")) as router:
            wait_for(lambda: router.router.fleet.get(full.url).healthy and router.router.fleet.get(free.url).healthy,
                     10, "fake workers healthy")
            answers = [httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": str(i)}).json()
                       for i in range(4)]
            assert answers == [{"worker": "free", "model": "m"}] * 4 and len(full.seen) >= 1
            assert _metric(router.url, 'kvserve_router_retries_total{reason="status_429"}') >= 1
            assert router.router.fleet.get(full.url).breaker.state.name.lower() == "closed"  # a 429 is no failure
