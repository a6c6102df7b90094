"""The online benchmark loop: send a workload to a server on a seeded arrival schedule.

    warmups (not measured) ──► t0 ─ gap ─► req0 ─ gap ─► req1 ... (open loop: a request is
    sent at its arrival time whether or not earlier ones finished; ``max_concurrency`` caps
    how many are in flight, later arrivals wait for a slot and are timed from their actual send)

The run ends after ``num_prompts`` requests, or, with ``duration_s``, when no new request may
start (the dataset is cycled) and every started one finished. Each request is timed by
``kvserve.bench.client.send_request``; results are summarized by ``kvserve.bench.metrics``.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm.auto import tqdm

from kvserve.bench.arrivals import arrival_gaps
from kvserve.bench.client import RequestFuncInput, send_request
from kvserve.bench.datasets import SampleRequest
from kvserve.bench.metrics import DEFAULT_PERCENTILES, BenchmarkMetrics, calculate_metrics
from kvserve.bench.prompts import encode
from kvserve.bench.provenance import ServerInfo, server_info
from kvserve.bench.stream import RequestFuncOutput
from kvserve.errors import InvalidRequestError


@dataclass(frozen=True)
class ServeConfig:
    """One online run. Times in seconds, SLOs in milliseconds.

    Attributes:
        base_url: server root, e.g. ``http://127.0.0.1:8000``.
        endpoint: ``/v1/completions`` or ``/v1/chat/completions``.
        model: the ``model`` field; None = the first id of the server's ``/v1/models``.
        request_rate: mean requests/s, ``inf`` = all at once.
        burstiness: gamma shape of the gaps (1 = Poisson).
        max_concurrency: most requests in flight (None = no cap).
        num_warmups: requests sent and discarded before the measured run.
        seed: seed of the arrival gaps.
        duration_s: keep sending for this long instead of stopping after the dataset.
        request_timeout_s: per-request HTTP timeout (a timed-out request counts as failed).
    """

    base_url: str
    endpoint: str = "/v1/completions"
    model: str | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_warmups: int = 0
    seed: int = 0
    duration_s: float | None = None
    ignore_eos: bool = False
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    request_timeout_s: float = 600.0
    disable_tqdm: bool = False


@dataclass(frozen=True)
class ServeRun:
    """A finished online run: its config, the server, the summary, every measured request, the
    warmups' outcomes (``warmup_failed`` of ``num_warmups`` failed, first reason given), and
    ``num_distinct_prompts``: fewer than ``len(outputs)`` when a ``duration_s`` run cycled the
    workload, so that a prefix cache may have served repeats."""

    config: ServeConfig
    model: str
    server: ServerInfo
    metrics: BenchmarkMetrics
    outputs: list[RequestFuncOutput]
    warmup_failed: int
    warmup_first_error: str
    num_distinct_prompts: int


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

    async def send(self, request: RequestFuncInput) -> RequestFuncOutput:
        try:
            out = await send_request(self.client, request)
        finally:
            self.release()
        if self.pbar is not None:
            self.pbar.update(1)
        return out

    async def start(self, request: RequestFuncInput) -> asyncio.Task:
        await self.acquire()
        return asyncio.create_task(self.send(request))


def _to_input(sample: SampleRequest, config: ServeConfig, model: str) -> RequestFuncInput:
    return RequestFuncInput(
        prompt=sample.prompt, prompt_len=sample.prompt_len, output_len=sample.expected_output_len,
        model=model, endpoint=config.endpoint, ignore_eos=config.ignore_eos,
        temperature=config.temperature, extra_body=config.extra_body,
    )


async def _warmup(sender: _Sender, inputs: Iterator[RequestFuncInput], count: int) -> list[RequestFuncOutput]:
    tasks = [await sender.start(next(inputs)) for _ in range(count)]
    return list(await asyncio.gather(*tasks))


async def _measured(sender: _Sender, inputs: Iterator[RequestFuncInput], config: ServeConfig,
                    count: int | None) -> tuple[list[RequestFuncOutput], float]:
    """Launch on the arrival schedule; return outputs (in launch order) and the duration (s).

    Arrival times are absolute (cumulative gaps from the start), so a request held back by the
    concurrency cap is sent as soon as a slot frees and the schedule does not drift.
    """
    gaps = arrival_gaps(config.request_rate, config.burstiness, config.seed)
    loop = asyncio.get_running_loop()
    start = next_at = loop.time()
    t0 = time.perf_counter()
    tasks: list[asyncio.Task] = []
    for request in itertools.islice(inputs, count):
        next_at += next(gaps)
        if config.duration_s is not None and next_at - start >= config.duration_s:
            break
        if next_at > loop.time():
            await asyncio.sleep(next_at - loop.time())
        await sender.acquire()
        if config.duration_s is not None and loop.time() - start >= config.duration_s:
            sender.release()
            break
        tasks.append(asyncio.create_task(sender.send(request)))
        await asyncio.sleep(0)  # let started requests make progress even when all gaps are 0
    outputs = list(await asyncio.gather(*tasks))
    end = max((o.end_time for o in outputs), default=time.perf_counter())
    return outputs, end - t0


async def run_serve(config: ServeConfig, samples: Sequence[SampleRequest], tokenizer: Any,
                    warmup_samples: Sequence[SampleRequest] | None = None) -> ServeRun:
    """Run one online benchmark of ``samples`` against ``config.base_url``.

    ``config.num_warmups`` requests are sent first (cycling ``warmup_samples``, else ``samples``)
    and discarded; give separate warmup prompts so that a prefix cache is not warmed for the
    measured ones.

    Raises:
        InvalidRequestError: no samples, ``--duration`` with an unbounded start rate, or no
            ``model`` given and the server lists none.
    """
    if not samples:
        raise InvalidRequestError("the workload has no prompts", "num_prompts")
    if config.duration_s is not None and math.isinf(config.request_rate) and not config.max_concurrency:
        raise InvalidRequestError(
            "--duration with --request-rate inf would start requests without end; "
            "give --max-concurrency or a finite --request-rate", "duration")
    timeout = httpx.Timeout(config.request_timeout_s)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=config.base_url, timeout=timeout, limits=limits) as client:
        server = await server_info(client)
        model = config.model or server.model
        if not model:
            raise InvalidRequestError(
                f"no --model given and {config.base_url}/v1/models lists none ({server.models_error})", "model")
        warm_inputs = (_to_input(s, config, model) for s in itertools.cycle(warmup_samples or samples))
        warm = await _warmup(_Sender(client, config.max_concurrency, None), warm_inputs, config.num_warmups)
        count = None if config.duration_s is not None else len(samples)
        inputs = (_to_input(s, config, model) for s in itertools.cycle(samples))
        with tqdm(total=count, desc="requests", disable=config.disable_tqdm, leave=False) as pbar:
            outputs, duration = await _measured(_Sender(client, config.max_concurrency, pbar), inputs, config, count)
    fill_output_tokens(outputs, tokenizer)
    metrics = calculate_metrics(outputs, duration, config.percentiles, config.goodput_slos_ms)
    warm_failed = [o for o in warm if not o.success]
    return ServeRun(config, model, server, metrics, outputs, len(warm_failed),
                    warm_failed[0].error if warm_failed else "", min(len(outputs), len(samples)))
