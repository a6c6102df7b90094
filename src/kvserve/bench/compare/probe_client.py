"""Small HTTP pieces the probes share: a canary request, a stream the client drops, the engine's
gauges from its Prometheus ``/metrics``, and waiting for the first token.

Gauges are read by name suffix so one reader fits vLLM (``vllm:``), kvserve (``kvserve:``) and
SGLang-style prefixes: ``num_requests_running``, ``num_requests_waiting``, ``kv_cache_usage_perc``
(summed over label sets). The text format is parsed with ``prometheus_client``'s parser.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

import httpx

from kvserve.bench.client import RequestFuncInput, build_headers, build_payload, send_request
from kvserve.bench.stream import RequestFuncOutput, SSELineSplitter, SSEParser, chunk_content

GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
POLL_S = 0.25


@dataclass(frozen=True)
class Canary:
    """The probes' yardstick request, and the one that proves an engine answers."""

    request: RequestFuncInput

    async def send(self, client: httpx.AsyncClient) -> RequestFuncOutput:
        return await send_request(client, self.request)

    async def idle_latency(self, client: httpx.AsyncClient, tries: int = 3) -> float | None:
        """Median E2E seconds of ``tries`` canaries sent one after another (None if all failed)."""
        latencies = sorted(out.latency for out in [await self.send(client) for _ in range(tries)] if out.success)
        return latencies[len(latencies) // 2] if latencies else None


async def wait_first_token(client: httpx.AsyncClient, request: RequestFuncInput, timeout_s: float,
                           alive: Any = None) -> tuple[float | None, str]:
    """Send ``request`` (one output token) until it succeeds: ``(perf_counter time of its first
    token, "")``, or ``(None, last error)`` after ``timeout_s`` or when ``alive()`` turns False."""
    one = replace(request, output_len=1, request_id=None)
    deadline = time.perf_counter() + timeout_s
    error = "no attempt"
    while time.perf_counter() < deadline:
        if alive is not None and not alive():
            return None, "the start command exited"
        out = await send_request(client, one)
        if out.success:
            return out.start_time + out.ttft, ""
        error = out.error
        await asyncio.sleep(POLL_S)
    return None, f"no first token within {timeout_s:g} s: {error}"


async def stream_and_drop(client: httpx.AsyncClient, request: RequestFuncInput, after_chunks: int) -> int:
    """Stream ``request`` and close the connection after ``after_chunks`` content chunks (or at the
    end); returns the content chunks read."""
    lines, parser, seen = SSELineSplitter(), SSEParser(), 0
    try:
        async with client.stream("POST", request.endpoint, json=build_payload(request),
                                 headers=build_headers(request)) as response:
            if response.status_code != 200:
                return 0
            async for data in response.aiter_bytes():
                for line in lines.feed(data):
                    event = parser.feed_line(line)
                    if event is not None and event.strip() != "[DONE]" and _has_content(event):
                        seen += 1
                if seen >= after_chunks:
                    break  # leaving the block closes the connection mid-stream
    except httpx.HTTPError:
        pass
    return seen


def _has_content(event: str) -> bool:
    import json

    try:
        return bool(chunk_content(json.loads(event)))
    except ValueError:
        return False


async def read_gauges(client: httpx.AsyncClient, metrics_url: str | None) -> tuple[dict[str, float], str]:
    """``({gauge: value}, "")`` from ``metrics_url``, or ``({}, why not)``."""
    if metrics_url is None:
        return {}, "no metrics_url"
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = await client.get(metrics_url)
        response.raise_for_status()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                for gauge in GAUGES:
                    if sample.name.endswith(gauge):
                        values[gauge] = values.get(gauge, 0.0) + float(sample.value)
    except (httpx.HTTPError, ValueError) as exc:
        return {}, f"{type(exc).__name__}: {exc}"
    return values, "" if values else "no known gauges in the metrics"
