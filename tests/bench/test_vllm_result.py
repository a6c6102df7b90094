"""vLLM's flat result and printed summary from hand-made request outcomes (values worked out by
hand with vLLM's formulas: numpy's mean, median, population std and linear percentiles, in ms)."""

from __future__ import annotations

import math

import pytest

from kvserve.bench.metrics import calculate_metrics
from kvserve.bench.provenance import ServerInfo
from kvserve.bench.runner import ServeConfig, ServeRun
from kvserve.bench.stream import RequestFuncOutput
from kvserve.bench.vllm_result import (ResultHeader, flat_result, format_summary, parse_percentile_metrics,
                                       percentile_key, result_filename)


def outputs() -> list[RequestFuncOutput]:
    return [
        RequestFuncOutput(success=True, prompt_len=10, output_tokens=3, output_tokens_source="usage",
                          generated_text="abc", ttft=0.1, itl=[0.2, 0.3], latency=0.6, start_time=100.0,
                          end_time=100.6, client_queue_time=0.0),
        RequestFuncOutput(success=True, prompt_len=20, output_tokens=1, output_tokens_source="usage",
                          generated_text="d", ttft=0.5, itl=[], latency=0.5, start_time=100.2, end_time=100.7,
                          client_queue_time=0.1),
        RequestFuncOutput(success=False, error="HTTP 500: boom", prompt_len=5, start_time=100.3, end_time=100.4,
                          latency=0.1),
    ]


def make_run(request_rate: float = math.inf, max_concurrency: int | None = 2, slos=None) -> ServeRun:
    config = ServeConfig("http://h", request_rate=request_rate, max_concurrency=max_concurrency,
                         goodput_slos_ms=slos or {})
    outs = outputs()
    metrics = calculate_metrics(outs, 2.0, (50.0,), slos)
    return ServeRun(config, "m", ServerInfo("http://h", None, "", "m", ""), metrics, outs, 0, "", 3)


HEADER = ResultHeader("openai", None, "org/Model-7B", "tok", 3, {"run": "x"}, date="20260101-000000")
SELECTED = ["ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue"]


def test_flat_result_values():
    r = flat_result(make_run(slos={"ttft": 200.0}), HEADER, SELECTED, [50.0, 99.0, 99.9], save_detailed=True)
    assert (r["completed"], r["failed"], r["total_input_tokens"], r["total_output_tokens"]) == (2, 1, 30, 4)
    assert (r["request_throughput"], r["output_throughput"], r["total_token_throughput"]) == (1.0, 2.0, 17.0)
    assert r["request_goodput"] == 0.5  # only the first is within ttft <= 200 ms
    assert r["input_lens"] == [10, 20, 5] and r["output_lens"] == [3, 1, 0]
    assert r["errors"] == ["", "", "HTTP 500: boom"] and r["queue_times"] == [0.0, 0.1, 0.0]
    # every chunk lands in the first second: 100.1, 100.3, 100.6 and 100.7
    assert r["max_output_tokens_per_s"] == 4.0 and r["max_concurrent_requests"] == 2 and r["rtfx"] == 0.0
    assert r["mean_ttft_ms"] == pytest.approx(300) and r["median_ttft_ms"] == pytest.approx(300)
    assert r["std_ttft_ms"] == pytest.approx(200) and r["p99_ttft_ms"] == pytest.approx(496)
    assert r["p99.9_ttft_ms"] == pytest.approx(499.6) and r["p50_ttft_ms"] == pytest.approx(300)
    assert r["mean_tpot_ms"] == pytest.approx(250) and r["std_tpot_ms"] == 0  # one request has > 1 token
    assert (r["mean_itl_ms"], r["std_itl_ms"]) == (pytest.approx(250), pytest.approx(50))
    assert r["mean_e2el_ms"] == pytest.approx(550) and r["mean_client_queue_time_ms"] == pytest.approx(50)
    assert "mean_e2el_including_client_queue_ms" not in r  # only for a finite request rate
    assert (r["date"], r["backend"], r["endpoint_type"], r["run"]) == ("20260101-000000", "openai", "openai", "x")
    assert (r["request_rate"], r["max_concurrency"]) == ("inf", 2)
    finite = flat_result(make_run(4.0), HEADER, SELECTED, [50.0], save_detailed=False)
    assert finite["mean_e2el_including_client_queue_ms"] == pytest.approx((0.6 + 0.6) / 2 * 1000)
    assert finite["request_rate"] == 4.0 and finite["request_goodput"] is None
    assert not {"input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors"} & set(finite)


def test_empty_metrics_are_zero_as_np_mean_of_0():
    run = make_run()
    run.outputs[:] = [o for o in run.outputs if not o.success]
    r = flat_result(run, HEADER, ["ttft"], [99.0], save_detailed=False)
    assert (r["completed"], r["mean_ttft_ms"], r["p99_ttft_ms"], r["max_output_tokens_per_s"]) == (0, 0, 0, 0)


def test_summary_is_vllms_layout():
    r = flat_result(make_run(4.0, slos={"ttft": 200.0}), HEADER, ["ttft", "e2el"], [99.0], save_detailed=False)
    lines = format_summary(r, ["ttft", "e2el"], [99.0]).splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[1] == "Successful requests:".ljust(40) + " " + "2".ljust(10)
    assert lines[3] == "Maximum request concurrency:".ljust(40) + " " + "2".ljust(10)
    assert lines[4] == "Request rate configured (RPS):".ljust(40) + " " + "4.00".ljust(10)
    assert "Request goodput (req/s):".ljust(40) + " " + "0.50".ljust(10) in lines
    assert "Peak concurrent requests:".ljust(40) + " " + "2.00".ljust(10) in lines
    assert "---------------Time to First Token----------------" in lines
    assert "P99 TTFT (ms):".ljust(40) + " " + "496.00".ljust(10) in lines
    assert "----------------End-to-end Latency----------------" in lines
    assert lines[-1] == "=" * 50 and not any("TPOT" in line for line in lines)


def test_file_names(tmp_path):
    run = make_run()
    assert result_filename(HEADER, run, None, None) == "openai-infqps-concurrency2-Model-7B-20260101-000000.json"
    labelled = ResultHeader("vllm", "mine", "m", "m", 1, {}, date="d")
    assert result_filename(labelled, make_run(2.5, None), None, None) == "mine-2.5qps-m-d.json"
    assert result_filename(labelled, run, str(tmp_path / "out"), "x.json") == str(tmp_path / "out" / "x.json")
    assert (tmp_path / "out").is_dir()


def test_percentile_names():
    assert [percentile_key(p) for p in (99.0, 99.9, 50.0)] == ["99", "99.9", "50"]
    assert parse_percentile_metrics(None) == ["ttft", "tpot", "itl"]
