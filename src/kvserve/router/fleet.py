"""The fleet: every worker the router knows, by URL, and the choice of one for a request.

    workers ── model filter ── routable ── minus tried ──► policy.select ──► Decision
    standby ──(an active worker ejected, or desired_replicas > active)──► promote

A worker without a known model (a worker that did not say, with no model registry) serves any
model name.
"""

from __future__ import annotations

import logging

from kvserve.router.policies import Decision, RouteRequest, RoutingPolicy
from kvserve.router.worker import Worker

logger = logging.getLogger(__name__)


class Fleet:
    """Args:
        policy: the routing policy.
    """

    def __init__(self, policy: RoutingPolicy):
        self.policy = policy
        self.workers: dict[str, Worker] = {}

    def add(self, worker: Worker) -> Worker:
        """Add (or replace) a worker; its KV-event subscription starts."""
        old = self.workers.get(worker.url)
        if old is not None:
            old.stop_events()
        self.workers[worker.url] = worker
        worker.start_events()
        return worker

    def remove(self, url: str) -> Worker | None:
        worker = self.workers.pop(url.rstrip("/"), None)
        if worker is not None:
            worker.stop_events()
        return worker

    def get(self, url: str) -> Worker | None:
        return self.workers.get(url.rstrip("/"))

    def serving(self, model: str | None, states: tuple[str, ...] = ("active",)) -> list[Worker]:
        """Workers in ``states`` that serve ``model`` (None = any)."""
        return [w for w in self.workers.values() if w.state in states
                and (model is None or w.model is None or w.model == model)]

    def choose(self, model: str | None, request: RouteRequest, exclude: set[str] = frozenset()) -> Decision | None:
        """A routable worker for ``request`` (not one in ``exclude`` while others are left), or
        None when none is routable."""
        routable = [w for w in self.serving(model) if w.routable]
        fresh = [w for w in routable if w.url not in exclude]
        candidates = fresh or routable
        if not candidates:
            return None
        return self.policy.select(candidates, request)

    @property
    def active(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.state == "active"]

    def promote_standby(self, model: str | None = None) -> Worker | None:
        """Put one healthy standby worker (of ``model`` when given) into rotation."""
        for worker in self.serving(model, ("standby",)):
            if worker.healthy:
                worker.state = "active"
                logger.info("promoted standby worker %s into rotation", worker.url)
                return worker
        return None
