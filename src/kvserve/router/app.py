"""The router's HTTP app and the object that wires its parts.

    GET  /health                 200 while some worker is routable, else 503 (HEAD too)   (open)
    GET  /metrics                the router's series (``kvserve.router.metrics``)          (open)
    GET  /v1/models[/{id}]       the model registry's models (else the workers' own)
    POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize
                                 forwarded to a worker (``kvserve.router.proxy``), handled by
                                 ``RouterApp`` before FastAPI (its routing, request and response
                                 layers cost more CPU than the whole hop otherwise)
    GET  /workers                every worker and its state
    POST /workers                add one: {"url", "model"?, "kv_events"?, "standby"?}
    DELETE /workers/{url}        drain it (no new requests; waits for in-flight ones), remove it

Keys and rate limits are the worker's own code (``kvserve.api.auth``, ``kvserve.api.rate_limit``),
charged per request with prompt + max_tokens tokens as a worker charges them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvserve.api.auth import authenticate
from kvserve.api.errors import APIError, install_error_handlers
from kvserve.api.rate_limit import RateLimiter
from kvserve.net import nodelay_transport
from kvserve.router.config import RouterConfig
from kvserve.router.fleet import Fleet
from kvserve.router.metrics import QUANTILES, FleetCollector, RouterMetrics
from kvserve.router.monitor import Monitor
from kvserve.router.policies import Decision, RouteRequest, make_policy
from kvserve.router.prefix import request_block_hashes
from kvserve.router.prompts import PromptTokenizer
from kvserve.router.forwarding import RouterApp
from kvserve.router.proxy import Proxy
from kvserve.router.registry import ModelRegistry
from kvserve.router.scaling import ScalingInputs, SlidingWindow, desired_replicas
from kvserve.router.upstream import UpstreamClient
from kvserve.router.worker import KVEventsEndpoint, Worker

logger = logging.getLogger(__name__)



class Router:
    """The router's state and its parts (see the package docstring).

    Args:
        config: the flags.
        tokenizers: model name -> PromptTokenizer; the ``None`` key serves models not listed.
        model_registry: the ``--model-registry`` file's content, or None.
    """

    def __init__(self, config: RouterConfig, tokenizers: dict[str | None, PromptTokenizer],
                 model_registry: ModelRegistry | None = None):
        self.config = config
        self.tokenizers = tokenizers
        self.model_registry = model_registry
        self.metrics = RouterMetrics()
        self.fleet = Fleet(make_policy(config.policy, config))
        self.limiter = RateLimiter(config.requests_per_minute, config.tokens_per_minute,
                                   config.max_concurrent_requests)
        self.ttft_window = SlidingWindow(config.scaling.window_seconds)
        self.itl_window = SlidingWindow(config.scaling.window_seconds)
        self.prefix_queries = 0.0
        self.prefix_hits = 0.0
        self.client: httpx.AsyncClient | None = None  # health checks and /metrics scrapes
        self.upstream: UpstreamClient | None = None  # forwarded requests
        self.proxy: Proxy | None = None
        self.monitor: Monitor | None = None
        self.metrics.registry.register(FleetCollector(self.snapshot))

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(transport=nodelay_transport(limits), timeout=self.config.request_timeout)
        self.monitor = Monitor(self.fleet, self.config.health, self.metrics, self.client,
                               self._on_prefix_delta, self._on_ejected)
        self.upstream = UpstreamClient()
        self.proxy = Proxy(self.fleet, self.upstream, self.config.retry, self.metrics, self.config.request_timeout,
                           self._on_failure, self._on_routed)
        self.proxy.ttft_window, self.proxy.itl_window = self.ttft_window, self.itl_window
        if self.config.pd:
            from kvserve.router.pd import PrefillLeg

            self.proxy.prefill_leg = PrefillLeg(self.config.prefill_urls, self.upstream,
                                                self.config.pd_prefill_timeout, self.metrics.registry)
        await self.monitor.check_all()
        await self.monitor.scrape_all()
        self.monitor.start()

    async def stop(self) -> None:
        if self.monitor is not None:
            await self.monitor.stop()
        for worker in list(self.fleet.workers.values()):
            worker.stop_events()
        if self.client is not None:
            await self.client.aclose()
        if self.upstream is not None:
            self.upstream.close()

    # -- workers ---------------------------------------------------------------------------------

    def add_worker(self, url: str, model: str | None = None, kv_events: str | None = None,
                   standby: bool = False) -> Worker:
        """Register a worker (it takes requests after its first health check passes)."""
        health = self.config.health
        from kvserve.router.circuit_breaker import CircuitBreaker

        worker = Worker(url, model=model or self._registry_model(url), state="standby" if standby else "active",
                        kv_events=KVEventsEndpoint.parse(kv_events) if kv_events else None,
                        breaker=CircuitBreaker(health.cb_failure_threshold, health.cb_open_seconds))
        return self.fleet.add(worker)

    def _registry_model(self, url: str) -> str | None:
        if self.model_registry is None:
            return None
        return next((m.name for m in self.model_registry.models if url.rstrip("/") in
                     [u.rstrip("/") for u in m.workers]), None)

    async def drain(self, worker: Worker) -> int:
        """Stop sending to ``worker``, wait for its in-flight requests (at most drain_timeout),
        remove it. Returns the requests still in flight when it was removed (0 = drained)."""
        worker.state = "draining"
        deadline = time.monotonic() + self.config.drain_timeout
        while worker.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.fleet.remove(worker.url)
        if self.upstream is not None:
            self.upstream.discard(worker.url)
        return worker.in_flight

    def _on_failure(self, worker: Worker, fatal: bool) -> None:
        opened = worker.breaker.record_failure(fatal)
        if fatal and self.monitor is not None:
            self.monitor.eject(worker, "breaker")
        elif opened:
            self.metrics.ejections.labels(worker.url, "breaker").inc()

    def _on_ejected(self, worker: Worker) -> None:
        if worker.state == "active":
            self.fleet.promote_standby(worker.model)

    def _on_routed(self, worker: Worker, decision: Decision, route: RouteRequest) -> None:
        policy = self.fleet.policy.name
        self.metrics.decisions.labels(policy, decision.reason).inc()
        self.metrics.prompt_tokens.labels(policy).inc(route.num_tokens)
        self.metrics.matched_tokens.labels(policy).inc(decision.matched_tokens)
        if route.hashes:
            worker.approx_index.insert(route.hashes)

    def _on_prefix_delta(self, queries: float, hits: float) -> None:
        self.prefix_queries += queries
        self.prefix_hits += hits
        wanted = self.desired_replicas()
        if wanted > len([w for w in self.fleet.active if w.routable]):
            self.fleet.promote_standby()

    # -- the scaling signal and the scrape-time gauges --------------------------------------------

    def desired_replicas(self) -> int:
        active = [w for w in self.fleet.active if w.routable]
        kv = sum(w.load_snapshot.kv_usage for w in active) / len(active) if active else 0.0
        inputs = ScalingInputs(len(active), sum(w.load_snapshot.waiting for w in active),
                               self.ttft_window.percentile(0.9), kv)
        return desired_replicas(inputs, self.config.scaling)

    def snapshot(self) -> tuple:
        workers = [(w.url, w.state, w.routable, w.in_flight, w.load_snapshot.running, w.load_snapshot.waiting,
                    w.load_snapshot.kv_usage) for w in self.fleet.workers.values()]
        active = self.fleet.active
        fleet = {
            "num_requests_waiting": sum(w.load_snapshot.waiting for w in active),
            "num_requests_running": sum(w.load_snapshot.running for w in active),
            "kv_cache_usage_perc": sum(w.load_snapshot.kv_usage for w in active) / len(active) if active else 0.0,
            "active_replicas": len([w for w in active if w.routable]),
            "standby_replicas": len(self.fleet.serving(None, ("standby",))),
            "desired_replicas": self.desired_replicas(),
        }
        rate = self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
        quantiles = {}
        for kind, window in (("ttft", self.ttft_window), ("itl", self.itl_window)):
            values = {q: window.percentile(q) for q in QUANTILES}
            quantiles[kind] = {q: v for q, v in values.items() if v is not None}
        return workers, fleet, {self.fleet.policy.name: rate}, quantiles

    # -- requests --------------------------------------------------------------------------------

    def route_request(self, path: str, body: dict, model: str | None) -> RouteRequest:
        """The prompt's hashes (when the policy or a token limit needs them) and length."""
        needs_tokens = self.fleet.policy.needs_prompt or self.config.tokens_per_minute is not None
        tokenizer = self.tokenizers.get(model) or self.tokenizers.get(None)
        block_size = self._block_size(model)
        if not needs_tokens or tokenizer is None:
            return RouteRequest(None, 0, block_size)
        token_ids = tokenizer.token_ids(path, body)
        if token_ids is None:
            return RouteRequest(None, 0, block_size)
        hashes = request_block_hashes(token_ids, block_size, body.get("cache_salt")) \
            if self.fleet.policy.needs_prompt else None
        return RouteRequest(hashes, len(token_ids), block_size)

    def _block_size(self, model: str | None) -> int:
        entry = self.model_registry.find(model) if self.model_registry and model else None
        return entry.block_size if entry is not None else self.config.block_size

    def check_model(self, model: str | None) -> None:
        """Raises: APIError 404 ``model_not_found`` when no worker or registry entry serves it."""
        if self.model_registry is not None:
            if model is not None and self.model_registry.find(model) is None:
                raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
            return
        known = {w.model for w in self.fleet.workers.values()}
        if model is not None and None not in known and model not in known:
            raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def build_router_app(router: Router) -> RouterApp:
    """The ASGI app over ``router`` (its parts start and stop with the app's lifespan)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await router.start()
        try:
            yield
        finally:
            await router.stop()

    app = FastAPI(title="kvserve route", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.router = router
    install_error_handlers(app)
    _add_open_routes(app, router)
    _add_model_routes(app, router)
    _add_worker_routes(app, router)
    return RouterApp(router, app)


def _add_open_routes(app: FastAPI, router: Router) -> None:
    @app.api_route("/health", methods=["GET", "HEAD"], include_in_schema=False)
    async def health() -> Response:
        if not any(w.routable for w in router.fleet.active):
            raise APIError(503, "No worker is healthy.", code="no_worker_available")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _model_cards(router: Router) -> list[dict]:
    if router.model_registry is not None:
        return [{"id": m.name, "object": "model", "created": 0, "owned_by": "kvserve", "root": m.weights,
                 "version": m.version, "quantization": m.quantization, "tokenizer": m.tokenizer_path,
                 "workers": [u.rstrip("/") for u in m.workers]} for m in router.model_registry.models]
    roots: dict[str, str | None] = {}
    for worker in router.fleet.workers.values():
        if worker.model is not None and roots.get(worker.model) is None:
            roots[worker.model] = worker.root  # the workers' own root (a kvserve worker: its path)
    return [{"id": name, "object": "model", "created": 0, "owned_by": "kvserve", "root": roots[name]}
            for name in sorted(roots)]


def _add_model_routes(app: FastAPI, router: Router) -> None:
    def auth(request: Request) -> None:
        authenticate(request, router.config.api_keys)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        auth(request)
        return JSONResponse({"object": "list", "data": _model_cards(router)})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> JSONResponse:
        auth(request)
        card = next((c for c in _model_cards(router) if c["id"] == model_id), None)
        if card is None:
            raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
        return JSONResponse(card)


def _add_worker_routes(app: FastAPI, router: Router) -> None:
    def describe(w: Worker) -> dict:
        return {"url": w.url, "model": w.model, "state": w.state, "healthy": w.healthy, "routable": w.routable,
                "in_flight": w.in_flight, "breaker": w.breaker.state.value, "load": w.load,
                "kv_events": f"{w.kv_events.endpoint},{w.kv_events.replay or ''}" if w.kv_events else None,
                "cached_blocks": len(w.event_index.hashes) if w.event_index is not None else None}

    @app.get("/workers")
    async def list_workers(request: Request) -> JSONResponse:
        authenticate(request, router.config.api_keys)
        return JSONResponse({"workers": [describe(w) for w in router.fleet.workers.values()]})

    @app.post("/workers")
    async def add_worker(request: Request) -> JSONResponse:
        authenticate(request, router.config.api_keys)
        try:
            body = json.loads(await request.body())
            url = body["url"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise APIError(400, 'Send {"url": "http://host:port"} (optional: model, kv_events, standby).',
                           param="url") from None
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise APIError(400, f"url must be an http(s) URL, got {url!r}", param="url")
        worker = router.add_worker(url, body.get("model"), body.get("kv_events"), bool(body.get("standby")))
        await router.monitor.check(worker)
        return JSONResponse(describe(worker), status_code=201)

    @app.delete("/workers/{url:path}")
    async def remove_worker(url: str, request: Request) -> JSONResponse:
        authenticate(request, router.config.api_keys)
        worker = router.fleet.get(url)
        if worker is None:
            raise APIError(404, f"No worker {url!r}; GET /workers lists them.", param="url")
        left = await router.drain(worker)
        return JSONResponse({"url": worker.url, "drained": left == 0, "in_flight_left": left})
