"""The failure-mode probes, one engine at a time, after its load levels. Each returns a JSON-ready
dict with ``outcome`` (``pass``, ``fail`` or ``skipped``), ``summary`` (one line for the report's
table) and its numbers (seconds, milliseconds where named ``_ms``).

=================  ==========================================================================
probe              what is done / what passes
=================  ==========================================================================
over_long_prompt   one prompt ``excess_tokens`` past the context; pass: a 4xx, and a canary
                   succeeds afterwards. Time to answer recorded.
cache_exhaustion   ``requests`` long prompts at once; errors, TTFT p99; then canaries until one
                   is within ``recovery_factor`` x the idle canary (recovery time from the
                   burst's end); pass: recovered (errors are reported, a clean refusal is fine)
disconnect_storm   ``requests`` streams dropped after a chunk; gauges until nothing runs or
                   waits (drain time); the next canary against the idle one; pass: drained and
                   the canary succeeded
restart            (with a restart command) closed-loop canaries, the restart, until a canary
                   succeeds again; errors during and time to ready; pass: ready in time
cold_start         (with a start command) start command to first token; pass: a first token
=================  ==========================================================================
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, replace
from typing import Any

import httpx
import numpy as np

from kvserve.bench.client import RequestFuncInput, send_request
from kvserve.bench.compare.engine_process import EngineProcess
from kvserve.bench.compare.probe_client import Canary, read_gauges, stream_and_drop, wait_first_token
from kvserve.bench.compare.probe_spec import ProbesSpec
from kvserve.bench.compare.spec import STOP_START
from kvserve.bench.prompts import ExactLengthPrompter
from kvserve.bench.stream import RequestFuncOutput

PROBES = ("over_long_prompt", "cache_exhaustion", "disconnect_storm", "restart", "cold_start")


@dataclass
class ProbeContext:
    """What every probe needs about one engine. ``template`` is a request carrying the engine's
    model, endpoint and extra body; probes replace its prompt and lengths."""

    client: httpx.AsyncClient
    template: RequestFuncInput
    tokenizer: Any
    max_model_len: int | None
    probes: ProbesSpec
    metrics_url: str | None
    seed: int

    def prompter(self, salt: int) -> ExactLengthPrompter:
        return ExactLengthPrompter(self.tokenizer, np.random.default_rng(self.seed + salt))

    def request(self, prompt_len: int, output_len: int, salt: int, request_id: str | None = None) -> RequestFuncInput:
        text, ids = self.prompter(salt).text(prompt_len)
        return replace(self.template, prompt=text, prompt_len=len(ids), output_len=output_len, request_id=request_id)

    def canary(self) -> Canary:
        spec = self.probes.canary
        return Canary(self.request(spec.prompt_len, spec.output_len, salt=7))


def skipped(why: str) -> dict[str, Any]:
    return {"outcome": "skipped", "summary": why}


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0][:200] if error.strip() else ""


def _error_kinds(outputs: list[RequestFuncOutput]) -> dict[str, int]:
    return dict(collections.Counter(_first_line(o.error)[:80] for o in outputs if not o.success))


async def over_long_prompt(ctx: ProbeContext) -> dict[str, Any]:
    spec = ctx.probes.over_long_prompt
    if ctx.max_model_len is None:
        return skipped("context length unknown: /v1/models reports no max_model_len and the spec sets none")
    length = ctx.max_model_len + spec.excess_tokens
    request = ctx.request(length, 8, salt=11)
    start = time.perf_counter()
    try:
        response = await ctx.client.post(request.endpoint, json={**_payload(request), "stream": False},
                                         headers=request.headers, timeout=spec.timeout_s)
        status, body = response.status_code, response.text[:300]
    except httpx.HTTPError as exc:
        status, body = None, f"{type(exc).__name__}: {exc}"
    answer_s = time.perf_counter() - start
    after = await ctx.canary().send(ctx.client)
    clean = status is not None and 400 <= status < 500
    passed = clean and after.success
    summary = (f"{length}-token prompt: HTTP {status} in {answer_s * 1000:.0f} ms; "
               f"next request {'ok' if after.success else 'FAILED'}")
    return {"outcome": "pass" if passed else "fail", "summary": summary, "prompt_tokens": length,
            "status_code": status, "answer_s": answer_s, "body": body, "canary_after_ok": after.success}


def _payload(request: RequestFuncInput) -> dict[str, Any]:
    from kvserve.bench.client import build_payload

    payload = build_payload(request)
    payload.pop("stream_options", None)
    return payload


async def cache_exhaustion(ctx: ProbeContext) -> dict[str, Any]:
    spec = ctx.probes.cache_exhaustion
    if spec.prompt_len is None and ctx.max_model_len is None:
        return skipped("prompt_len not set and the context length is unknown")
    prompt_len = spec.prompt_len or max(1, ctx.max_model_len * 3 // 4)
    output_len = spec.output_len
    if ctx.max_model_len is not None:
        output_len = max(1, min(output_len, ctx.max_model_len - prompt_len))
    canary = ctx.canary()
    baseline = await canary.idle_latency(ctx.client)
    if baseline is None:
        return {"outcome": "fail", "summary": "the idle canary failed before the burst"}
    burst = [ctx.request(prompt_len, output_len, salt=100 + i) for i in range(spec.requests)]
    outputs = list(await asyncio.gather(*(send_request(ctx.client, r) for r in burst)))
    burst_end = max(o.end_time for o in outputs)
    recovery_s, canaries = None, 0
    while time.perf_counter() - burst_end < spec.recovery_timeout_s:
        out = await canary.send(ctx.client)
        canaries += 1
        if out.success and out.latency <= spec.recovery_factor * baseline:
            recovery_s = out.end_time - burst_end
            break
    done = [o for o in outputs if o.success]
    ttft_p99 = float(np.percentile([o.ttft * 1000 for o in done], 99)) if done else None
    failed = len(outputs) - len(done)
    summary = (f"{spec.requests} x {prompt_len}-token prompts at once: {failed} failed, TTFT p99 "
               f"{'-' if ttft_p99 is None else f'{ttft_p99:.0f} ms'}; "
               + (f"recovered {recovery_s:.2f} s after the burst" if recovery_s is not None
                  else f"not recovered within {spec.recovery_timeout_s:g} s"))
    return {"outcome": "pass" if recovery_s is not None else "fail", "summary": summary,
            "requests": spec.requests, "prompt_len": prompt_len, "output_len": output_len, "failed": failed,
            "errors": _error_kinds(outputs), "ttft_p99_ms": ttft_p99,
            "burst_s": burst_end - min(o.start_time for o in outputs), "idle_canary_s": baseline,
            "recovery_s": recovery_s, "canaries_sent": canaries}


async def _drain(ctx: ProbeContext, timeout_s: float) -> tuple[float | None, dict[str, float], str]:
    """Poll the gauges until nothing runs or waits: (seconds, last gauges, error)."""
    start = time.perf_counter()
    gauges, error = await read_gauges(ctx.client, ctx.metrics_url)
    while not error and time.perf_counter() - start < timeout_s:
        if gauges.get("num_requests_running", 0) + gauges.get("num_requests_waiting", 0) == 0:
            return time.perf_counter() - start, gauges, ""
        await asyncio.sleep(0.1)
        gauges, error = await read_gauges(ctx.client, ctx.metrics_url)
    return None, gauges, error or f"still busy after {timeout_s:g} s"


async def disconnect_storm(ctx: ProbeContext) -> dict[str, Any]:
    spec = ctx.probes.disconnect_storm
    output_len = spec.output_len if ctx.max_model_len is None else min(spec.output_len, ctx.max_model_len - 32)
    canary = ctx.canary()
    baseline = await canary.idle_latency(ctx.client)
    requests = [ctx.request(16, max(output_len, 2), salt=300 + i) for i in range(spec.requests)]
    seen = await asyncio.gather(*(stream_and_drop(ctx.client, r, spec.disconnect_after_chunks) for r in requests))
    right_after, _ = await read_gauges(ctx.client, ctx.metrics_url)
    drain_s, settled, gauge_error = await _drain(ctx, spec.settle_timeout_s)
    after = await canary.send(ctx.client)
    ratio = after.latency / baseline if after.success and baseline else None
    drained = drain_s is not None or gauge_error == "no metrics_url"
    passed = after.success and drained
    summary = (f"{spec.requests} streams dropped after {spec.disconnect_after_chunks} chunk(s): "
               + (f"drained in {drain_s:.2f} s" if drain_s is not None else f"gauges: {gauge_error}")
               + (f"; next request {after.latency * 1000:.0f} ms ({ratio:.2f}x idle)" if ratio is not None
                  else f"; next request {'ok' if after.success else 'FAILED: ' + _first_line(after.error)}"))
    return {"outcome": "pass" if passed else "fail", "summary": summary, "requests": spec.requests,
            "chunks_read": list(seen), "gauges_right_after": right_after, "drain_s": drain_s,
            "gauges_settled": settled, "gauge_error": gauge_error, "idle_canary_s": baseline,
            "next_request_s": after.latency if after.success else None, "next_request_ok": after.success,
            "next_vs_idle": ratio}


async def _load_worker(ctx: ProbeContext, canary: Canary, stop: asyncio.Event,
                       sink: list[RequestFuncOutput]) -> None:
    while not stop.is_set():
        out = await canary.send(ctx.client)
        sink.append(out)
        if not out.success:
            await asyncio.sleep(0.25)  # a refused connection returns at once: retry as a client would


def _downtime(outputs: list[RequestFuncOutput]) -> float | None:
    """Seconds from the first failed request's end to the end of the first success sent after it
    (a request in flight since before the failure proves nothing); None: no failure or no recovery."""
    ordered = sorted(outputs, key=lambda o: o.end_time)
    first_fail = next((o.end_time for o in ordered if not o.success), None)
    if first_fail is None:
        return None
    back = next((o.end_time for o in ordered if o.success and o.start_time >= first_fail), None)
    return None if back is None else back - first_fail


async def restart(ctx: ProbeContext, engine: EngineProcess, ready_timeout_s: float) -> dict[str, Any]:
    spec = ctx.probes.restart
    canary, stop, outputs = ctx.canary(), asyncio.Event(), []
    workers = [asyncio.create_task(_load_worker(ctx, canary, stop, outputs)) for _ in range(spec.concurrency)]
    try:
        await asyncio.sleep(spec.load_before_s)
        t0 = time.perf_counter()
        try:
            await asyncio.to_thread(engine.restart)
        except Exception as exc:  # noqa: BLE001 - the report shows why the restart failed
            return {"outcome": "fail", "summary": f"restart command failed: {exc}"}
        first_token, error = await wait_first_token(ctx.client, canary.request, min(spec.timeout_s, ready_timeout_s),
                                                    alive=lambda: engine.spec.restart != STOP_START
                                                    or engine.exited() is None)
        ready_s = None if first_token is None else first_token - t0
        await asyncio.sleep(spec.load_after_s)
    finally:
        stop.set()
        await asyncio.gather(*workers)
    in_flight = [o for o in outputs if o.start_time < t0 <= o.end_time]
    failed = [o for o in outputs if not o.success]
    downtime = _downtime(outputs)
    summary = (f"restart under {spec.concurrency} streams: {sum(not o.success for o in in_flight)} of "
               f"{len(in_flight)} in-flight requests failed, {len(failed)} failed attempts in all"
               + (f", {downtime:.2f} s without service" if downtime is not None else "")
               + (f"; ready {ready_s:.2f} s after the restart began" if ready_s is not None else f"; not ready: {error}"))
    return {"outcome": "pass" if ready_s is not None else "fail", "summary": summary,
            "command": engine.spec.restart, "time_to_ready_s": ready_s, "downtime_s": downtime,
            "in_flight_at_restart": len(in_flight), "in_flight_failed": sum(not o.success for o in in_flight),
            "requests_total": len(outputs), "failed_total": len(failed), "errors": _error_kinds(failed)}


def cold_start_result(seconds: float | None, error: str, command: str) -> dict[str, Any]:
    """The cold-start probe's entry from the measured start (see ``run``)."""
    if seconds is None:
        return {"outcome": "fail", "summary": f"no first token: {error}", "command": command, "cold_start_s": None}
    return {"outcome": "pass", "summary": f"start command to first token: {seconds:.2f} s", "command": command,
            "cold_start_s": seconds}
