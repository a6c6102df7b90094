"""Background loops of the router: active health checks and load scraping.

    every health interval, each worker: GET /health
        ok   -> successes += 1; an ejected worker with success_threshold in a row is re-admitted
                (its breaker closed: the check was the probe)
        fail -> failures += 1; failure_threshold in a row eject it (its cache is forgotten: it
                comes back empty) and a standby worker is promoted
    every load interval, each active or draining worker: GET /metrics
        num_requests_running / waiting, kv_cache_usage_perc, prefix_cache_queries / hits
        (``kvserve:`` or ``vllm:`` series; SGLang's ``sglang:num_running_reqs`` /
        ``num_queue_reqs`` / ``token_usage``), and a kvserve worker's predicted TTFT
        (``slo_predicted_ttft_seconds``, ``slo_step_cost_seconds{term="prefill_token"}``)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvserve.router.config import HealthConfig
from kvserve.router.fleet import Fleet
from kvserve.router.metrics import RouterMetrics
from kvserve.router.worker import Worker, WorkerLoad

logger = logging.getLogger(__name__)

_SERIES = {
    "num_requests_running": "running", "num_requests_waiting": "waiting", "kv_cache_usage_perc": "kv_usage",
    "prefix_cache_queries": "prefix_queries", "prefix_cache_hits": "prefix_hits",
    "num_running_reqs": "running", "num_queue_reqs": "waiting", "token_usage": "kv_usage",
}


def parse_worker_metrics(text: str) -> WorkerLoad:
    """The load series of a worker's ``/metrics`` text (sums over label sets)."""
    load = WorkerLoad()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        name = family.name.split(":", 1)[-1]
        if name == "slo_predicted_ttft_seconds" and family.samples:
            load.predicted_ttft = family.samples[0].value
        elif name == "slo_step_cost_seconds":
            load.prefill_token_cost = next((s.value for s in family.samples if s.labels.get("term") == "prefill_token"),
                                           None)
        field = _SERIES.get(name)
        if field is None:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_created",)):
                continue
            values[field] = values.get(field, 0.0) + sample.value
    for field, value in values.items():
        setattr(load, field, value)
    return load


class Monitor:
    """Args:
        fleet: the workers.
        config: intervals and thresholds.
        metrics: where ejections and re-admissions are counted.
        on_prefix_delta: called with (queries, hits) the workers added since the last scrape.
        on_ejected: called with the worker after an ejection (the app promotes a standby).
    """

    def __init__(self, fleet: Fleet, config: HealthConfig, metrics: RouterMetrics, client: httpx.AsyncClient,
                 on_prefix_delta: Callable[[float, float], None], on_ejected: Callable[[Worker], None]):
        self.fleet, self.config, self.metrics, self.client = fleet, config, metrics, client
        self.on_prefix_delta, self.on_ejected = on_prefix_delta, on_ejected
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop(self.check_all, self.config.interval)),
                       asyncio.create_task(self._loop(self.scrape_all, self.config.load_interval))]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _loop(self, action, interval: float) -> None:
        while True:
            try:
                await action()
            except Exception:  # noqa: BLE001 - a monitoring round must never end the loop
                logger.exception("router monitor round failed")
            await asyncio.sleep(interval)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in list(self.fleet.workers.values())))

    async def check(self, worker: Worker) -> bool:
        """One health check of ``worker``; returns whether it passed."""
        try:
            response = await self.client.get(worker.url + "/health", timeout=self.config.timeout)
            ok = response.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            self._passed(worker)
            if worker.model is None:
                await self._learn_model(worker)
        else:
            self._failed(worker)
        return ok

    async def _learn_model(self, worker: Worker) -> None:
        """Ask a worker of unknown model for its ``/v1/models`` (the first id)."""
        try:
            response = await self.client.get(worker.url + "/v1/models", timeout=self.config.timeout)
            card = response.json()["data"][0]
            worker.model = card["id"]
            worker.root = card.get("root") if isinstance(card.get("root"), str) else None
        except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
            pass

    def _passed(self, worker: Worker) -> None:
        worker.check_failures = 0
        worker.check_successes += 1
        if worker.healthy:
            return
        first = worker.check_successes == 1 and worker.num_requests == 0 and not worker.breaker.num_opened
        if first or worker.check_successes >= self.config.success_threshold:
            worker.healthy = True
            worker.breaker.record_success()
            if not first:
                self.metrics.readmissions.labels(worker.url).inc()
                logger.info("worker %s is healthy again: back in rotation", worker.url)

    def _failed(self, worker: Worker) -> None:
        worker.check_successes = 0
        worker.check_failures += 1
        if worker.healthy and worker.check_failures >= self.config.failure_threshold:
            self.eject(worker, "health")

    def eject(self, worker: Worker, cause: str) -> None:
        """Take ``worker`` out of rotation until its health checks pass again."""
        was_healthy = worker.healthy
        worker.healthy = False
        worker.check_successes = 0
        worker.forget_cache()
        if was_healthy:
            self.metrics.ejections.labels(worker.url, cause).inc()
            logger.warning("worker %s ejected (%s)", worker.url, cause)
            self.on_ejected(worker)

    async def scrape_all(self) -> None:
        workers = [w for w in self.fleet.workers.values() if w.state in ("active", "draining") and w.healthy]
        await asyncio.gather(*(self.scrape(w) for w in workers))

    async def scrape(self, worker: Worker) -> None:
        try:
            response = await self.client.get(worker.url + "/metrics", timeout=self.config.timeout)
            if response.status_code != 200:
                return
            load = parse_worker_metrics(response.text)
        except (httpx.HTTPError, ValueError):
            return
        load.scraped_at = time.monotonic()
        load.in_flight_at_scrape = worker.in_flight
        before = worker.load_snapshot
        if before.scraped_at and load.prefix_queries >= before.prefix_queries:
            self.on_prefix_delta(load.prefix_queries - before.prefix_queries, load.prefix_hits - before.prefix_hits)
        worker.load_snapshot = load
