"""``kvserve route --pd``: each completion first runs its prefill on a prefill worker
(``kvserve serve --kv-role producer``), then continues on a decode worker
(``--kv-role consumer``) that fetches the prompt's KV from it::

    client ─► router ─► prefill worker: the body with max_tokens 1, stream false,
                        kv_transfer_params {"do_remote_decode": true}
                     ◄─ 200 {... "kv_transfer_params": {"do_remote_prefill": true, "remote_host", ...}}
              router ─► decode worker (the fleet's choice, retries as usual): the client's body
                        with those kv_transfer_params; its answer goes to the client as it is

Prefill workers are taken in turn, the one with fewest prefills in flight first. When the prefill
leg fails (no prefill worker answers, a non-200, no kv_transfer_params), the request goes to a
decode worker as it came, and that worker computes the prompt itself: slower, never lost.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

from prometheus_client import Counter

from kvserve.router.upstream import UpstreamClient, UpstreamError

logger = logging.getLogger(__name__)

PD_PATHS = ("/v1/completions", "/v1/chat/completions")
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
        self._next = 0
        self.prefills = Counter("kvserve_router_pd_prefills", "Prefill legs of disaggregated requests, by outcome "
                                "(ok, or why the decode worker computed the prompt itself).", ["outcome"],
                                registry=registry)

    def _choose(self) -> str:
        start = self._next
        self._next = (self._next + 1) % len(self.urls)
        order = self.urls[start:] + self.urls[:start]
        return min(order, key=lambda url: self.in_flight[url])

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
        if not isinstance(body, dict) or body.get("kv_transfer_params") is not None:
            return request
        params = await self._prefill(request, body)
        if params is None:
            return request
        return replace(request, body=json.dumps({**body, "kv_transfer_params": params}).encode())

    async def _prefill(self, request, body: dict) -> dict | None:
        leg = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
        leg.pop("stream_options", None)
        if "max_completion_tokens" in leg:
            leg["max_completion_tokens"] = 1
        if leg.get("n", 1) != 1:
            leg["n"] = 1
        headers = [(k, v) for k, v in request.headers if k in _PASSED_HEADERS]
        url = self._choose()
        self.in_flight[url] += 1
        try:
            upstream = await self.client.pool(url).request(b"POST", request.path, headers, json.dumps(leg).encode(),
                                                           self.timeout)
            try:
                status, answer = upstream.status, await upstream.read()
            finally:
                upstream.release()
        except UpstreamError as exc:
            return self._failed("unreachable", f"prefill worker {url}: {exc}")
        finally:
            self.in_flight[url] -= 1
        if status != 200:
            return self._failed(f"status_{status // 100}xx", f"prefill worker {url} answered {status}: {answer[:200]!r}")
        try:
            params = json.loads(answer).get("kv_transfer_params")
        except (ValueError, AttributeError):
            params = None
        if not isinstance(params, dict) or not params.get("do_remote_prefill"):
            return self._failed("no_params", f"prefill worker {url} gave no kv_transfer_params (is it started "
                                              "with --kv-role producer?)")
        self.prefills.labels("ok").inc()
        return params

    def _failed(self, outcome: str, why: str) -> None:
        self.prefills.labels(outcome).inc()
        logger.warning("%s; the decode worker computes the prompt itself", why)
        return None
