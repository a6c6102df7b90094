"""The router's prefill leg (``kvserve route --pd``) without servers: a client's own
kv_transfer_params are dropped, a prefill worker that cannot be reached is skipped for a while
(requests then go straight to the decode workers, unchanged), other paths pass through."""

from __future__ import annotations

import asyncio
import json

from prometheus_client import CollectorRegistry

from kvserve.free_port import free_port
from kvserve.router.pd import PrefillLeg
from kvserve.router.policies import RouteRequest
from kvserve.router.proxy import ForwardRequest
from kvserve.router.upstream import UpstreamClient


def closed_port() -> int:
    return free_port()  # nothing listens there


def forward(body: dict, path: str = "/v1/completions") -> ForwardRequest:
    return ForwardRequest(path, json.dumps(body).encode(), [(b"content-type", b"application/json")], "r1", "m",
                          RouteRequest(None, 4), False, 0.0)


def outcomes(registry) -> dict:
    return {s.labels["outcome"]: s.value for m in registry.collect() for s in m.samples
            if s.name.endswith("_total")}


def test_an_unreachable_prefill_worker_is_skipped_and_client_params_never_pass():
    async def scenario():
        registry = CollectorRegistry()
        leg = PrefillLeg((f"http://127.0.0.1:{closed_port()}",), UpstreamClient(), 5.0, registry)
        planted = {"prompt": "hi", "max_tokens": 4,
                   "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.0.0.1", "remote_port": 1}}
        first = await leg.prepare(forward(planted))
        assert json.loads(first.body) == {"prompt": "hi", "max_tokens": 4}  # dropped; no prefill params
        second = await leg.prepare(forward({"prompt": "hi", "max_tokens": 4}))
        assert second.body == forward({"prompt": "hi", "max_tokens": 4}).body  # unchanged
        assert outcomes(registry) == {"unreachable": 1.0, "no_worker": 1.0}  # the second did not try it
        other = forward({"input": "x"}, path="/v1/embeddings")
        assert (await leg.prepare(other)) is other

    asyncio.run(scenario())
