"""The online benchmark loop: send a workload to a server on a seeded arrival schedule.

    ready check ──► warmups (not measured) ──► t0 ─ gap ─► req0 ─ gap ─► req1 ... (open loop: a
    request arrives on schedule whether or not earlier ones finished; ``max_concurrency`` caps how
    many are in flight, a later arrival waits for a slot and that wait is its client queue time)

The run ends after ``num_prompts`` requests, or, with ``duration_s``, when no new request may
start (the dataset is cycled) and every started one finished. Each request is timed by
``kvserve.bench.client.send_request``; results are summarized by ``kvserve.bench.metrics`` (and in
vLLM's flat form by ``kvserve.bench.vllm_result``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import numpy as np
from tqdm.auto import tqdm

from kvserve.bench.arrivals import RampUp, arrival_gaps, arrival_schedule
from kvserve.bench.client import Api, RequestFuncInput, send_request
from kvserve.bench.datasets import SampleRequest
from kvserve.bench.metrics import DEFAULT_PERCENTILES, BenchmarkMetrics, calculate_metrics
from kvserve.bench.prompts import encode
from kvserve.bench.provenance import ServerInfo, server_info
from kvserve.bench.stream import RequestFuncOutput
from kvserve.errors import InvalidRequestError
from kvserve.net import nodelay_transport

READY_RETRY_S = 5.0  # vLLM's wait_for_endpoint retry interval
ENDPOINT_OF_API = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}  # a sample's own api


@dataclass(frozen=True)
class ServeConfig:
    """One online run. Times in seconds, SLOs in milliseconds.

    Attributes:
        base_url: server root, e.g. ``http://127.0.0.1:8000``.
        endpoint: the path requests are posted to; ``api`` the payload shape.
        model: the ``model`` field; None = the first id of the server's ``/v1/models``.
        headers: sent with every request (API key, ``--header``).
        verify_tls: verify HTTPS certificates (off with ``--insecure``).
        request_rate: mean requests/s, ``inf`` = all at once; ``ramp_up`` replaces it.
        burstiness: gamma shape of the gaps (1 = Poisson, inf = constant).
        max_concurrency: most requests in flight (None = no cap).
        num_warmups: requests sent and discarded before the measured run.
        seed: seed of the arrival gaps and of the adapter choice.
        duration_s: keep sending for this long instead of stopping after the dataset.
        extra_body: merged into every payload (sampling flags, ``--extra-body``).
        logprobs: completions' ``logprobs``.
        request_id_prefix: ``x-request-id`` = prefix + request index ('' = no header).
        lora_modules: adapter names used as ``model``, one per request (``lora_assignment``:
            seeded ``random`` or ``round-robin``).
        ready_check_timeout_s: retry the first request until it succeeds, at most this long.
        request_timeout_s: per-request HTTP timeout (a timed-out request counts as failed).
    """

    base_url: str
    endpoint: str = "/v1/completions"
    api: Api = "completions"
    model: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    verify_tls: bool = True
    request_rate: float = math.inf
    burstiness: float = 1.0
    ramp_up: RampUp | None = None
    max_concurrency: int | None = None
    num_warmups: int = 0
    seed: int = 0
    duration_s: float | None = None
    ignore_eos: bool = False
    extra_body: dict[str, Any] = field(default_factory=dict)
    logprobs: int | None = None
    request_id_prefix: str = ""
    lora_modules: tuple[str, ...] = ()
    lora_assignment: str = "random"
    ready_check_timeout_s: float = 0.0
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    request_timeout_s: float = 600.0
    disable_tqdm: bool = False


@dataclass(frozen=True)
class ServeRun:
    """A finished online run: its config, the server, the summary, every measured request, the
    warmups' outcomes (``warmup_failed`` of ``num_warmups`` failed, first reason given),
    ``num_distinct_prompts`` (fewer than ``len(outputs)`` when a ``duration_s`` run cycled the
    workload, so that a prefix cache may have served repeats), and vLLM's ``rps_change_events``
    (``{"rps", "timestamp"}`` each time a ramp-up passed a whole number of requests/s)."""

    config: ServeConfig
    model: str
    server: ServerInfo
    metrics: BenchmarkMetrics
    outputs: list[RequestFuncOutput]
    warmup_failed: int
    warmup_first_error: str
    num_distinct_prompts: int
    rps_change_events: list[dict[str, Any]] = field(default_factory=list)


def fill_output_tokens(outputs: Sequence[RequestFuncOutput], tokenizer: Any) -> None:
    """Where the server reported no usage, count the generated text's tokens with ``tokenizer``."""
    for out in outputs:
        if out.success and out.output_tokens is None:
            out.output_tokens = len(encode(tokenizer, out.generated_text))
            out.output_tokens_source = "tokenizer"


class _Sender:
    """Sends inputs through one client under an optional concurrency cap.

    The caller takes a slot (``await acquire()``) before starting a request and the request frees
    it when done, so the launcher, not a pile of waiting tasks, holds back arrivals beyond the cap.
    """

    def __init__(self, client: httpx.AsyncClient, max_concurrency: int | None, pbar: tqdm | None):
        self.client, self.pbar = client, pbar
        self.slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def acquire(self) -> None:
        if self.slots is not None:
            await self.slots.acquire()

    def release(self) -> None:
        if self.slots is not None:
            self.slots.release()

    async def send(self, request: RequestFuncInput, arrived: float | None = None) -> RequestFuncOutput:
        try:
            out = await send_request(self.client, request)
        finally:
            self.release()
        if arrived is not None:
            out.client_queue_time = max(0.0, out.start_time - arrived)
        if self.pbar is not None:
            self.pbar.update(1)
        return out

    async def start(self, request: RequestFuncInput) -> asyncio.Task:
        await self.acquire()
        return asyncio.create_task(self.send(request))


def _inputs(samples: Sequence[SampleRequest], config: ServeConfig, model: str, id_prefix: str,
            ) -> Iterator[RequestFuncInput]:
    """The samples as requests, cycled, numbered from 0 (``x-request-id`` = prefix + number)."""
    rng = np.random.default_rng(config.seed)
    for index, sample in enumerate(itertools.cycle(samples)):
        name = model
        if config.lora_modules:
            pick = index if config.lora_assignment == "round-robin" else int(rng.integers(len(config.lora_modules)))
            name = config.lora_modules[pick % len(config.lora_modules)]
        api, endpoint = config.api, config.endpoint
        if sample.api is not None and sample.api != config.api:
            api, endpoint = sample.api, ENDPOINT_OF_API[sample.api]
        extra = {**config.extra_body, **sample.extra_body} if sample.extra_body else config.extra_body
        yield RequestFuncInput(
            prompt=sample.prompt, prompt_len=sample.prompt_len, output_len=sample.expected_output_len,
            model=name, endpoint=endpoint, api=api, ignore_eos=config.ignore_eos,
            logprobs=config.logprobs, extra_body=extra,
            request_id=f"{id_prefix}{index}" if id_prefix else None,
        )


async def _ready_check(sender: _Sender, request: RequestFuncInput, timeout_s: float) -> None:
    """vLLM's ``wait_for_endpoint``: send ``request`` every 5 s until it succeeds.

    Raises:
        InvalidRequestError: no success within ``timeout_s`` (the last error is quoted).
    """
    deadline = time.perf_counter() + timeout_s
    print(f"Waiting for endpoint to become up in {timeout_s:g} seconds")
    while True:
        out = await send_request(sender.client, request)
        if out.success:
            print("Initial test run completed.")
            return
        left = deadline - time.perf_counter()
        if left <= 0:
            raise InvalidRequestError(f"Initial test run failed within --ready-check-timeout-sec {timeout_s:g}: "
                                      f"{out.error.strip().splitlines()[-1] if out.error else 'no answer'}",
                                      "ready_check_timeout_sec")
        await asyncio.sleep(min(READY_RETRY_S, left))


async def _warmup(sender: _Sender, inputs: Iterator[RequestFuncInput], count: int) -> list[RequestFuncOutput]:
    tasks = [await sender.start(next(inputs)) for _ in range(count)]
    return list(await asyncio.gather(*tasks))


def _schedule(config: ServeConfig, count: int | None) -> Iterator[tuple[float, float]]:
    """(offset from the start in seconds, current rate) per request: vLLM's fixed-count schedule,
    or endless seeded gaps for a ``duration_s`` run."""
    if count is not None:
        offsets, rates = arrival_schedule(count, config.request_rate, config.burstiness, config.seed,
                                          config.ramp_up)
        yield from zip(offsets, rates)
        return
    now = 0.0
    for gap in arrival_gaps(config.request_rate, config.burstiness, config.seed):
        now += gap
        yield now, config.request_rate


async def _measured(sender: _Sender, inputs: Iterator[RequestFuncInput], config: ServeConfig,
                    count: int | None) -> tuple[list[RequestFuncOutput], float, list[dict[str, Any]]]:
    """Launch on the arrival schedule; return outputs (in launch order), the duration (s) and the
    ramp-up's rate changes.

    Arrival times are absolute (offsets from the start), so a request held back by the
    concurrency cap is sent as soon as a slot frees and the schedule does not drift.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    t0 = time.perf_counter()
    tasks: list[asyncio.Task] = []
    events: list[dict[str, Any]] = []
    last_rps = -1 if config.ramp_up is None else config.ramp_up.start_rps
    if config.ramp_up is not None:
        events.append({"rps": last_rps, "timestamp": dt.datetime.now().isoformat()})
    for request, (offset, rate) in zip(itertools.islice(inputs, count), _schedule(config, count)):
        if config.duration_s is not None and offset >= config.duration_s:
            break
        if start + offset > loop.time():
            await asyncio.sleep(start + offset - loop.time())
        if config.ramp_up is not None and int(rate) > last_rps:
            stamp = dt.datetime.now().isoformat()
            events += [{"rps": rps, "timestamp": stamp} for rps in range(last_rps + 1, int(rate) + 1)]
            last_rps = int(rate)
        arrived = time.perf_counter()
        await sender.acquire()
        if config.duration_s is not None and loop.time() - start >= config.duration_s:
            sender.release()
            break
        tasks.append(asyncio.create_task(sender.send(request, arrived)))
        await asyncio.sleep(0)  # let started requests make progress even when all gaps are 0
    outputs = list(await asyncio.gather(*tasks))
    end = max((o.end_time for o in outputs), default=time.perf_counter())
    return outputs, end - t0, events


def _check(config: ServeConfig, samples: Sequence[SampleRequest]) -> None:
    if not samples:
        raise InvalidRequestError("the workload has no prompts", "num_prompts")
    if config.duration_s is not None and math.isinf(config.request_rate) and not config.max_concurrency:
        raise InvalidRequestError(
            "--duration with --request-rate inf would start requests without end; "
            "give --max-concurrency or a finite --request-rate", "duration")
    if config.duration_s is not None and config.ramp_up is not None:
        raise InvalidRequestError("--duration and --ramp-up-strategy cannot be combined", "duration")


async def run_serve(config: ServeConfig, samples: Sequence[SampleRequest], tokenizer: Any,
                    warmup_samples: Sequence[SampleRequest] | None = None) -> ServeRun:
    """Run one online benchmark of ``samples`` against ``config.base_url``.

    ``config.num_warmups`` requests are sent first (cycling ``warmup_samples``, else ``samples``)
    and discarded; give separate warmup prompts so that a prefix cache is not warmed for the
    measured ones. With ``config.ready_check_timeout_s`` the first measured request is sent (and
    retried) before anything else, as vLLM's ready check.

    Raises:
        InvalidRequestError: no samples, ``--duration`` with an unbounded start rate or a ramp-up,
            no ``model`` given and the server lists none, or the ready check failed.
    """
    _check(config, samples)
    timeout = httpx.Timeout(config.request_timeout_s)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=config.base_url, timeout=timeout, headers=config.headers,
                                 transport=nodelay_transport(limits, verify=config.verify_tls)) as client:
        server = await server_info(client)
        model = config.model or server.model
        if not model:
            raise InvalidRequestError(
                f"no --model given and {config.base_url}/v1/models lists none ({server.models_error})", "model")
        if config.ready_check_timeout_s > 0:
            first = next(_inputs(samples, replace(config, lora_modules=()), model, ""))
            await _ready_check(_Sender(client, None, None), first, config.ready_check_timeout_s)
        warm = await _warmup(_Sender(client, config.max_concurrency, None),
                             _inputs(warmup_samples or samples, config, model, ""), config.num_warmups)
        count = None if config.duration_s is not None else len(samples)
        inputs = _inputs(samples, config, model, config.request_id_prefix)
        with tqdm(total=count, desc="requests", disable=config.disable_tqdm, leave=False) as pbar:
            outputs, duration, events = await _measured(_Sender(client, config.max_concurrency, pbar), inputs,
                                                        config, count)
    fill_output_tokens(outputs, tokenizer)
    metrics = calculate_metrics(outputs, duration, config.percentiles, config.goodput_slos_ms)
    warm_failed = [o for o in warm if not o.success]
    return ServeRun(config, model, server, metrics, outputs, len(warm_failed),
                    warm_failed[0].error if warm_failed else "", min(len(outputs), len(samples)), events)
