"""Latency targets over HTTP on a real engine: bad targets are 400s naming the field or header; a
request whose target the engine cannot keep is refused at once with 429, Retry-After and the
prediction (a stream never starts); accepted ones report ``slo_missed`` in usage; the classes of
--slo-classes apply by priority and API key; /metrics and /debug/slo show outcomes and the cost
model."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from kvserve.slo.targets import SLOClasses
from kvserve.testing.live_server import start_live_server

MODEL = "tiny-slo"
KEYS = {"Authorization": "Bearer k"}
CLASSES = '{"interactive": {"ttft_ms": 60000, "tpot_ms": 60000, "priority": 0}, "instant": {"ttft_ms": 5, "priority": 3}}'


@pytest.fixture(scope="module")
def server(tiny_llama):
    # one seat: a request behind a long one waits for all of its tokens; classes by priority need
    # --scheduling-policy priority (a non-zero priority is refused otherwise, as in vLLM)
    srv = start_live_server(str(tiny_llama), served_model_name=MODEL, api_key="k", max_model_len=512, block_size=16,
                            num_gpu_blocks_override=128, max_num_seqs=1, dtype="float32", scheduling_policy="priority",
                            settings={"slo_classes": SLOClasses.from_json(CLASSES)})
    with httpx.Client(base_url=srv.base_url, headers=KEYS, timeout=120) as http:
        for i in range(12):  # steps of both kinds, so the cost model is ready
            assert http.post("/v1/completions", json=body(f"warm {i}", max_tokens=4)).status_code == 200
        assert http.get("/debug/slo").json()["step_cost"]["ready"]
    yield srv
    srv.stop()


def body(prompt: str, **extra) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **extra}


def metric(http: httpx.Client, name: str, **labels) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f"kvserve:{name}") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("extra,headers,param", [
    ({"slo": {"ttft_ms": -1}}, {}, "slo.ttft_ms"),
    ({"slo": {"tpot_ms": 0}}, {}, "slo.tpot_ms"),
    ({"slo": {"ttft_ms": "soon"}}, {}, "slo.ttft_ms"),
    ({"slo": {"on_miss": "later"}}, {}, "slo.on_miss"),
    ({"slo": {"deadline": 5}}, {}, "slo.deadline"),
    ({"slo": 5}, {}, "slo"),
    ({}, {"X-SLO-TTFT-Ms": "0.1"}, "X-SLO-TTFT-Ms"),
    ({}, {"X-SLO-TPOT-Ms": "fast"}, "X-SLO-TPOT-Ms"),
])
def test_bad_targets_are_400s_naming_the_field(server, extra, headers, param):
    with httpx.Client(base_url=server.base_url, headers={**KEYS, **headers}, timeout=60) as http:
        for path, payload in (("/v1/completions", body("x", **extra)),
                              ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                        "max_tokens": 4, **extra})):
            response = http.post(path, json=payload)
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == param


def test_a_request_that_cannot_be_on_time_is_refused_at_once_and_nothing_runs(server):
    with httpx.Client(base_url=server.base_url, headers=KEYS, timeout=120) as http:
        before = metric(http, "slo_requests_total", slo_class="request", outcome="refused")
        long = threading.Thread(target=httpx.post, args=(server.base_url + "/v1/completions",),
                                kwargs={"json": body("the long one", max_tokens=300), "headers": KEYS, "timeout": 120})
        long.start()
        deadline = time.monotonic() + 30
        while server.engine_stats()["num_running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        for stream in (False, True):  # 300 steps ahead on the only seat: 5 ms cannot be kept
            response = http.post("/v1/completions", json=body("hurry", stream=stream, slo={"ttft_ms": 5}, priority=2))
            assert response.status_code == 429 and response.headers["content-type"] == "application/json"
            error = response.json()["error"]
            assert error["code"] == "slo_unattainable" and error["slo"] == {"ttft_ms": 5.0, "tpot_ms": None}
            assert error["predicted_ttft_ms"] is None or error["predicted_ttft_ms"] > 5
            assert "slo.ttft_ms=5" in error["message"] and int(response.headers["Retry-After"]) >= 1
        by_header = http.post("/v1/completions", json=body("hurry", priority=2), headers={"X-SLO-TTFT-Ms": "5"})
        by_class = http.post("/v1/completions", json=body("hurry", priority=3))
        assert by_header.status_code == 429 and by_class.status_code == 429
        assert by_class.json()["error"]["slo"]["ttft_ms"] == 5.0
        queued = http.post("/v1/completions", json=body("I will wait", slo={"ttft_ms": 5, "on_miss": "queue"}, priority=2),
                           headers={"X-SLO-TTFT-Ms": "7"})
        long.join()
        assert queued.status_code == 200 and queued.json()["usage"]["slo_missed"] is True  # accepted, late, said
        assert metric(http, "slo_requests_total", slo_class="request", outcome="refused") == before + 3
        assert metric(http, "slo_requests_total", slo_class="instant", outcome="refused") >= 1
        debug = http.get("/debug/slo").json()
        assert debug["refused"]["request"] >= 3 and debug["queued_predicted_miss"]["request"] >= 1
        assert debug["classes"]["instant"] == {"ttft_ms": 5.0, "tpot_ms": None, "on_miss": "reject", "priority": 3,
                                               "api_keys": 0}


def test_an_accepted_request_reports_its_outcome_and_one_without_targets_is_unchanged(server):
    with httpx.Client(base_url=server.base_url, headers=KEYS, timeout=120) as http:
        met_before = metric(http, "slo_requests_total", slo_class="interactive", outcome="met")
        plain = http.post("/v1/completions", json=body("no targets", priority=2))
        assert plain.status_code == 200 and "slo_missed" not in plain.json()["usage"]
        own = http.post("/v1/completions", json=body("generous", slo={"ttft_ms": 60000, "tpot_ms": 60000}, priority=2))
        assert own.status_code == 200 and own.json()["usage"]["slo_missed"] is False
        chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 4, "priority": 0, "stream": True,
                                                       "stream_options": {"include_usage": True}})
        usage = [line for line in chat.text.splitlines() if '"usage":{' in line][-1]
        assert '"slo_missed":false' in usage
        # the engine counts an outcome as it logs the step, which may come just after the stream ends
        deadline = time.monotonic() + 10
        while (metric(http, "slo_requests_total", slo_class="interactive", outcome="met") < met_before + 1
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert metric(http, "slo_requests_total", slo_class="interactive", outcome="met") == met_before + 1
        assert metric(http, "slo_step_cost_ready") == 1.0
        # every term is published; the non-negative fit may drop any one of them (a ready model has
        # at least one above zero), so the sum is what is certain
        costs = [metric(http, "slo_step_cost_seconds", term=term)
                 for term in ("step", "prefill_token", "decode_row", "attention_mpair")]
        assert all(c >= 0 for c in costs) and sum(costs) > 0
        margin = http.get("/debug/slo").json()["step_cost"]["margin"]
        assert 0.4 <= margin <= 0.8 and metric(http, "slo_plan_margin") == margin
        assert all(f'term="{term}"' in http.get("/metrics").text
                   for term in ("step", "prefill_token", "decode_row", "attention_mpair"))
        assert 'kvserve:slo_ttft_prediction_error_count{model_name="' in http.get("/metrics").text


def test_with_speculative_decoding_targets_change_nothing_but_the_report(tiny_llama):
    """Speculation runs decode rows of 1 + k tokens; the cost model learns those steps as they are,
    and a request with targets gets the same tokens as without them."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    srv = start_live_server(str(tiny_llama), served_model_name=MODEL, api_key="k", max_model_len=512, block_size=16,
                            num_gpu_blocks_override=128, dtype="float32", speculative_config=spec)
    try:
        with httpx.Client(base_url=srv.base_url, headers=KEYS, timeout=120) as http:
            for i in range(12):
                assert http.post("/v1/completions", json=body(f"a b c a b c warm {i}", max_tokens=6)).status_code == 200
            plain = http.post("/v1/completions", json=body("a b c a b c a b", max_tokens=24)).json()
            with_targets = http.post("/v1/completions", json=body("a b c a b c a b", max_tokens=24,
                                                                  slo={"ttft_ms": 60000, "tpot_ms": 60000})).json()
            assert with_targets["choices"][0]["text"] == plain["choices"][0]["text"]
            assert with_targets["usage"]["slo_missed"] is False and "slo_missed" not in plain["usage"]
            assert http.get("/debug/slo").json()["step_cost"]["ready"]
    finally:
        srv.stop()
