"""``kvserve route --pd``: each completion first runs its prefill on a prefill worker
(``kvserve serve --kv-role producer``), then continues on a decode worker
(``--kv-role consumer``) that fetches the prompt's KV from it::

    client ─► router ─► prefill worker: the body with max_tokens 1, stream false,
                        kv_transfer_params {"do_remote_decode": true}
                     ◄─ 200 {... "kv_transfer_params": {"do_remote_prefill": true, "remote_host", ...}}
              router ─► decode worker (the fleet's choice, retries as usual): the client's body
                        with those kv_transfer_params; its answer goes to the client as it is

Prefill workers are taken in turn, the one with fewest prefills in flight first. When the prefill
leg fails (no prefill worker answers within ``--pd-prefill-timeout``, a non-200, no
kv_transfer_params), the request goes to a decode worker without them, and that worker computes
the prompt itself: slower, never lost; the failed prefill worker is skipped for
``FAILED_WORKER_S`` (with none left, requests go straight to the decode workers). A client's own
``kv_transfer_params`` never reach a decode worker: the router sets them (or none).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

from prometheus_client import Counter

from kvserve.router.upstream import UpstreamClient, UpstreamError

logger = logging.getLogger(__name__)

PD_PATHS = ("/v1/completions", "/v1/chat/completions")
FAILED_WORKER_S = 30.0
_PASSED_HEADERS = (b"authorization", b"content-type", b"x-api-key")


class PrefillLeg:
    """Args:
        urls: the prefill workers.
        client: the router's worker connections.
        timeout: seconds a prefill may take.
        registry: where ``kvserve_router_pd_prefills_total{outcome}`` is counted.
    """

    def __init__(self, urls: tuple[str, ...], client: UpstreamClient, timeout: float, registry):
        self.urls = [u.rstrip("/") for u in urls]
        self.client = client
        self.timeout = timeout
        self.in_flight = dict.fromkeys(self.urls, 0)
        self.failed_until = dict.fromkeys(self.urls, 0.0)  # monotonic time
        self._next = 0
        self.prefills = Counter("kvserve_router_pd_prefills", "Prefill legs of disaggregated requests, by outcome "
                                "(ok, or why the decode worker computed the prompt itself).", ["outcome"],
                                registry=registry)

    def _choose(self) -> str | None:
        start = self._next
        self._next = (self._next + 1) % len(self.urls)
        now = time.monotonic()
        order = [url for url in self.urls[start:] + self.urls[:start] if self.failed_until[url] <= now]
        return min(order, key=lambda url: self.in_flight[url]) if order else None

    async def prepare(self, request):
        """``request`` (a ``ForwardRequest``) with its prefill done elsewhere: its body then carries
        the prefill worker's ``kv_transfer_params``; unchanged when it is not a completion or
        the prefill leg failed."""
        if request.path not in PD_PATHS:
            return request
        try:
            body = json.loads(request.body)
        except ValueError:
            return request  # the decode worker answers the 400
        if not isinstance(body, dict):
            return request
        own = body.pop("kv_transfer_params", None) is not None  # only the router says where K/V is
        params = await self._prefill(request, body)
        if params is None and not own:
            return request
        if params is not None:
            body["kv_transfer_params"] = params
        return replace(request, body=json.dumps(body).encode())

    async def _prefill(self, request, body: dict) -> dict | None:
        leg = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        for key in ("stream_options", "min_tokens"):
            leg.pop(key, None)
        if "max_completion_tokens" in leg:
            leg["max_completion_tokens"] = 1
        if leg.get("n", 1) != 1:
            leg["n"] = 1
        headers = [(k, v) for k, v in request.headers if k in _PASSED_HEADERS]
        url = self._choose()
        if url is None:
            self.prefills.labels("no_worker").inc()
            return None
        self.in_flight[url] += 1
        try:
            upstream = await self.client.pool(url).request(b"POST", request.path, headers, json.dumps(leg).encode(),
                                                           self.timeout)
            try:
                status, answer = upstream.status, await upstream.read()
            finally:
                upstream.release()
        except UpstreamError as exc:
            return self._failed(url, "unreachable", f"prefill worker {url}: {exc}")
        finally:
            self.in_flight[url] -= 1
        if status != 200:
            return self._failed(url, f"status_{status // 100}xx",
                                f"prefill worker {url} answered {status}: {answer[:200]!r}")
        try:
            params = json.loads(answer).get("kv_transfer_params")
        except (ValueError, AttributeError):
            params = None
        if not isinstance(params, dict) or not params.get("do_remote_prefill"):
            return self._failed(url, "no_params", f"prefill worker {url} gave no kv_transfer_params (is it "
                                                   "started with --kv-role producer?)")
        self.prefills.labels("ok").inc()
        return params

    def _failed(self, url: str, outcome: str, why: str) -> None:
        self.prefills.labels(outcome).inc()
        if outcome == "unreachable" or outcome == "status_5xx":  # the worker's fault: rest it a while
            self.failed_until[url] = time.monotonic() + FAILED_WORKER_S
        logger.warning("%s; the decode worker computes the prompt itself", why)
        return None
