"""Failures over HTTP: a request the engine fails on gets a 500 naming it (or an in-band error
event when streamed) while concurrent requests finish normally; a failure the engine cannot
attribute ends every request with an error, turns ``/health`` to 503, and makes ``kvserve
serve`` exit with status 1 (so a supervisor restarts it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kvserve.faults import STAGES
from kvserve.testing.live_server import free_port, start_live_server

BODY = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 8, "ignore_eos": True, "temperature": 0}


@pytest.fixture
def server(tiny_llama):
    srv = start_live_server(str(tiny_llama), served_model_name="tiny", api_key="k", max_model_len=256,
                            num_gpu_blocks_override=64)
    yield srv
    srv.stop()


def post(server, body, request_id=None, **kwargs) -> httpx.Response:
    headers = {"Authorization": "Bearer k", **({"X-Request-Id": request_id} if request_id else {})}
    return httpx.post(server.base_url + "/v1/completions", json=body, headers=headers, timeout=60, **kwargs)


def faults(server, stage):
    engine = server.engine
    return engine.output_processor.faults if stage == "detokenize" else engine.core.runner.faults


def wait_idle(server) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        stats = server.engine_stats()
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 and server.engine.num_unfinished_requests == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"engine not idle: {server.engine_stats()}")


@pytest.mark.parametrize("stage", STAGES)
def test_one_failing_request_is_a_500_and_the_others_finish(server, stage):
    expected = post(server, BODY).json()["choices"][0]["text"]
    faults(server, stage).fail(stage, "cmpl-boom-")  # ids of X-Request-Id "boom": cmpl-boom-<8 hex>-0
    with ThreadPoolExecutor(4) as pool:
        others = [pool.submit(post, server, BODY) for _ in range(3)]
        failed = post(server, BODY, "boom")
        texts = [f.result().json()["choices"][0]["text"] for f in others]
    assert failed.status_code == 500, failed.text
    error = failed.json()["error"]
    assert error["type"] == "server_error" and "(request cmpl-boom-" in error["message"]
    assert "injected fault" in error["message"] and failed.headers["x-request-id"] == "boom"
    assert texts == [expected] * 3
    stream = post(server, {**BODY, "stream": True}, "boom")
    events = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
    assert stream.status_code == 200 and events[-1] == "[DONE]"
    assert "(request cmpl-boom-" in json.loads(events[-2])["error"]["message"]
    faults(server, stage).clear()
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert post(server, BODY, "boom").json()["choices"][0]["text"] == expected
    wait_idle(server)
    server.core.kv_cache_manager.check_integrity()
    assert server.core.kv_cache_manager.usage == 0.0


def test_an_unattributable_failure_answers_everyone_and_health_turns_503(server):
    faults(server, "forward").fail("forward", "*")
    with ThreadPoolExecutor(3) as pool:
        responses = list(pool.map(lambda _: post(server, BODY), range(3)))
    # Whether they share a step (no request explains it) or come one per step (three failed steps
    # in a row), the engine stops: each request gets a 500, then /health says 503.
    assert [r.status_code for r in responses] == [500] * 3
    assert any("the engine failed" in r.json()["error"]["message"] for r in responses)
    assert httpx.get(server.base_url + "/health").status_code == 503
    refused = post(server, BODY)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_not_ready"


SERVE_WITH_A_BROKEN_SCHEDULER = """
import sys
from kvserve.scheduler.scheduler import Scheduler

schedule = Scheduler.schedule

def broken(self):
    if any("die" in r.request_id for r in self.waiting):
        raise RuntimeError("scheduler bug")
    return schedule(self)

Scheduler.schedule = broken
from kvserve.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_serve_exits_with_status_1_when_the_engine_dies(tmp_path):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITH_A_BROKEN_SCHEDULER, "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        body = {"prompt": "It is a truth", "max_tokens": 4}
        assert httpx.post(base + "/v1/completions", json=body, timeout=30).status_code == 200
        dying = httpx.post(base + "/v1/completions", json=body, headers={"X-Request-Id": "die"}, timeout=30)
        assert dying.status_code == 500 and "the engine failed" in dying.json()["error"]["message"]
        assert process.wait(timeout=30) == 1
        assert "exiting with status 1: the engine failed" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
