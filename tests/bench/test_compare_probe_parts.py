"""Pieces of the failure-mode probes on scripted inputs: the gauges read from a Prometheus text
page (vLLM's and kvserve's names), the downtime of a restart from scripted request outcomes, and
a streamed tool call counting as generated content."""

from __future__ import annotations

import asyncio

import httpx

from kvserve.bench.compare.probe_client import read_gauges
from kvserve.bench.compare.probes import _downtime
from kvserve.bench.stream import RequestFuncOutput, chunk_content

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# TYPE kvserve:kv_cache_usage_perc gauge
kvserve:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE other_total counter
other_total 7.0
"""


def gauges_of(text: str, status: int = 200):
    transport = httpx.MockTransport(lambda request: httpx.Response(status, text=text))

    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await read_gauges(client, "http://engine/metrics")

    return asyncio.run(go())


def test_gauges_summed_over_label_sets_by_name_suffix():
    assert gauges_of(PAGE) == ({"num_requests_running": 3.0, "num_requests_waiting": 4.0,
                                "kv_cache_usage_perc": 0.25}, "")
    assert gauges_of("other_total 1.0\n") == ({}, "no known gauges in the metrics")
    values, error = gauges_of("nope", status=404)
    assert values == {} and error.startswith("HTTPStatusError")
    assert asyncio.run(read_gauges(None, None)) == ({}, "no metrics_url")


def out(start: float, end: float, ok: bool) -> RequestFuncOutput:
    return RequestFuncOutput(success=ok, start_time=start, end_time=end, error="" if ok else "refused")


def test_downtime_from_first_failure_to_next_success():
    outputs = [out(0.0, 1.0, True), out(1.0, 1.5, False), out(1.5, 1.75, False), out(1.75, 4.0, True),
               out(1.0, 2.0, True)]  # sent before the first failure: its success does not end the downtime
    assert _downtime(outputs) == 4.0 - 1.5
    assert _downtime([out(0.0, 1.0, True)]) is None
    assert _downtime([out(0.0, 1.0, True), out(1.0, 2.0, False)]) is None  # never came back


def test_streamed_tool_call_is_content():
    chunk = {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "get_weather",
                                                                              "arguments": "{\"ci"}}]}}]}
    assert chunk_content(chunk) == "get_weather{\"ci"
    assert chunk_content({"choices": [{"delta": {"role": "assistant"}}]}) == ""
