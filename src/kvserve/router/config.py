"""``kvserve route`` flags -> :class:`RouterConfig` (frozen, built once).

Thresholds and their sources (docs/router.md explains the choices):

==========================  ========  =========================================================
flag                        default   from
==========================  ========  =========================================================
--cache-threshold           0.3       SGLang router's ``cache_threshold`` (router_args.py)
--balance-abs-threshold     64        SGLang router's ``balance_abs_threshold``
--balance-rel-threshold     1.5       SGLang router's ``balance_rel_threshold``
--queue-token-cost          8         kvserve: prefill tokens one request in a queue is worth
--retry-max-retries         3         SGLang: 5 (kvserve retries only before the first byte)
--retry-initial-backoff-ms  50        SGLang's; multiplier 1.5 and jitter 0.2 also SGLang's
--cb-failure-threshold      3         SGLang: 10 (a refused connection opens it at once)
==========================  ========  =========================================================
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from kvserve.engine.arg_types import non_negative_int, positive_int

POLICIES = ("cache_aware", "round_robin", "power_of_two", "least_load", "least_ttft")


@dataclass(frozen=True)
class RetryConfig:
    """Retries of a request that failed before its first byte reached the client.

    Attributes:
        max_retries: further attempts after the first (each on a worker not tried yet when one
            is left).
        initial_backoff, max_backoff: seconds before the first retry / at most.
        multiplier: backoff growth per retry; jitter: +- this fraction of random spread.
    """

    max_retries: int = 3
    initial_backoff: float = 0.05
    max_backoff: float = 1.0
    multiplier: float = 1.5
    jitter: float = 0.2


@dataclass(frozen=True)
class HealthConfig:
    """Active checks (``GET /health`` every ``interval`` s) and the passive circuit breaker.

    Attributes:
        interval, timeout: seconds between checks of each worker / per check.
        failure_threshold: failed checks in a row that eject a worker.
        success_threshold: good checks in a row that re-admit it.
        cb_failure_threshold: failed requests in a row (5xx, timeouts) that open its breaker; a
            refused connection opens it at once.
        cb_open_seconds: how long an open breaker refuses before one half-open probe.
        load_interval: seconds between scrapes of each worker's ``/metrics``.
    """

    interval: float = 2.0
    timeout: float = 2.0
    failure_threshold: int = 1
    success_threshold: int = 2
    cb_failure_threshold: int = 3
    cb_open_seconds: float = 5.0
    load_interval: float = 1.0


@dataclass(frozen=True)
class ScalingConfig:
    """Targets of the ``desired_replicas`` rule (``kvserve.router.scaling``)."""

    target_queue_per_replica: float = 4.0
    target_ttft_p90: float = 2.0
    target_kv_usage: float = 0.8
    min_replicas: int = 1
    max_replicas: int = 16
    window_seconds: float = 60.0


@dataclass(frozen=True)
class RouterConfig:
    """Everything ``kvserve route`` needs.

    Attributes:
        worker_urls: workers given on the command line (``http://host:port``).
        kv_events_endpoints: their KV-event PUB endpoints, in the same order (may be shorter;
            ``tcp://host:port``, replay on port + 1 unless given as ``pub,replay``).
        standby_workers: loaded workers kept out of rotation (the warm pool).
        registry_file: YAML list of workers (url, model, kv_events, standby).
        model_registry: YAML list of models (name, version, weights, tokenizer, ...).
        tokenizer: tokenizer folder for the workers' model when no model registry names one
            (default: the built-in model's).
        block_size: the workers' KV block size (kvserve's default 16; KV events carry theirs).
        policy, cache_threshold, balance_abs_threshold, balance_rel_threshold, queue_token_cost:
            routing (``kvserve.router.policies``).
        api_keys, requests_per_minute, tokens_per_minute, max_concurrent_requests: as
            ``kvserve serve``'s, enforced at the router.
        pd, prefill_urls, pd_prefill_timeout: disaggregated prefill/decode (``kvserve.router.pd``):
            every completion's prefill runs on one of ``prefill_urls`` (given up after
            ``pd_prefill_timeout`` seconds), then ``worker_urls`` decode it.
        request_timeout: seconds a worker may take to answer a request.
        drain_timeout: seconds ``DELETE /workers/{url}`` waits for in-flight requests.
    """

    host: str = "127.0.0.1"
    port: int = 9000
    worker_urls: tuple[str, ...] = ()
    kv_events_endpoints: tuple[str, ...] = ()
    standby_workers: tuple[str, ...] = ()
    registry_file: str | None = None
    model_registry: str | None = None
    tokenizer: str | None = None
    block_size: int = 16
    policy: str = "cache_aware"
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    queue_token_cost: float = 8.0
    api_keys: tuple[str, ...] = ()
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrent_requests: int | None = None
    pd: bool = False
    prefill_urls: tuple[str, ...] = ()
    pd_prefill_timeout: float = 120.0
    request_timeout: float = 600.0
    drain_timeout: float = 600.0
    retry: RetryConfig = field(default_factory=RetryConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    log_level: str = "info"


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_router_args(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kvserve route``."""
    g = parser.add_argument_group("workers")
    g.add_argument("--worker-urls", nargs="+", default=[], metavar="URL", help="workers, e.g. http://127.0.0.1:8001")
    g.add_argument("--kv-events-endpoints", nargs="+", default=[], metavar="EP",
                   help="each worker's KV-event endpoint in --worker-urls order: tcp://host:port (replay on "
                        "port + 1) or tcp://host:port,tcp://host:replay_port; workers without one are routed "
                        "by the approximate prefix index")
    g.add_argument("--standby-workers", nargs="+", default=[], metavar="URL",
                   help="the warm pool: loaded workers kept out of rotation, promoted when a worker is ejected "
                        "or desired_replicas exceeds the active count")
    g.add_argument("--pd", action="store_true",
                   help="disaggregated prefill/decode: each completion is prefilled on a --prefill-urls worker "
                        "(kvserve serve --kv-role producer), then decoded on a --worker-urls one (--kv-role consumer)")
    g.add_argument("--prefill-urls", nargs="+", default=[], metavar="URL", help="--pd: the prefill workers")
    g.add_argument("--pd-prefill-timeout", type=_positive_float, default=120.0,
                   help="--pd: seconds a prefill may take before the decode worker computes the prompt itself "
                        "(default 120)")
    g.add_argument("--registry-file", default=None, help="YAML list of workers (docs/router.md)")
    g.add_argument("--model-registry", default=None, help="YAML list of models (docs/router.md)")
    g.add_argument("--tokenizer", default=None, help="tokenizer folder of the workers' model (default: built-in)")
    g.add_argument("--block-size", type=positive_int, default=16, help="the workers' KV block size (default 16)")
    r = parser.add_argument_group("routing")
    r.add_argument("--policy", choices=POLICIES, default="cache_aware")
    r.add_argument("--cache-threshold", type=_fraction, default=0.3,
                   help="cache_aware: below this cached share of the prompt, route by load (default 0.3)")
    r.add_argument("--balance-abs-threshold", type=non_negative_int, default=64)
    r.add_argument("--balance-rel-threshold", type=_positive_float, default=1.5)
    r.add_argument("--queue-token-cost", type=float, default=8.0,
                   help="cache_aware: prefill tokens one request a worker is busy with is worth (default 8)")
    f = parser.add_argument_group("failures")
    f.add_argument("--health-check-interval", type=_positive_float, default=2.0, help="seconds (default 2)")
    f.add_argument("--health-check-timeout", type=_positive_float, default=2.0)
    f.add_argument("--health-failure-threshold", type=positive_int, default=1)
    f.add_argument("--health-success-threshold", type=positive_int, default=2)
    f.add_argument("--cb-failure-threshold", type=positive_int, default=3)
    f.add_argument("--cb-open-seconds", type=_positive_float, default=5.0)
    f.add_argument("--load-check-interval", type=_positive_float, default=1.0)
    f.add_argument("--retry-max-retries", type=non_negative_int, default=3)
    f.add_argument("--retry-initial-backoff-ms", type=_positive_float, default=50.0)
    f.add_argument("--retry-max-backoff-ms", type=_positive_float, default=1000.0)
    f.add_argument("--request-timeout", type=_positive_float, default=600.0)
    f.add_argument("--drain-timeout", type=_positive_float, default=600.0)
    s = parser.add_argument_group("scaling signal")
    s.add_argument("--target-queue-per-replica", type=_positive_float, default=4.0)
    s.add_argument("--target-ttft-p90", type=_positive_float, default=2.0, help="seconds")
    s.add_argument("--target-kv-usage", type=_fraction, default=0.8)
    s.add_argument("--min-replicas", type=positive_int, default=1)
    s.add_argument("--max-replicas", type=positive_int, default=16)
    a = parser.add_argument_group("gateway")
    a.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    a.add_argument("--port", type=non_negative_int, default=9000, help="TCP port (default 9000)")
    a.add_argument("--api-key", nargs="+", action="extend", default=[], metavar="KEY",
                   help="keys clients must send (default: $KVSERVE_API_KEY; none = open)")
    a.add_argument("--requests-per-minute", type=_positive_float, default=None)
    a.add_argument("--tokens-per-minute", type=_positive_float, default=None)
    a.add_argument("--max-concurrent-requests", type=positive_int, default=None)


def router_config_from_args(args: argparse.Namespace) -> RouterConfig:
    """Build the config (``$KVSERVE_API_KEY`` is read here, once, when no ``--api-key``)."""
    if args.pd != bool(args.prefill_urls):
        raise ValueError("--pd needs --prefill-urls (the prefill workers), and --prefill-urls needs --pd")
    keys = tuple(args.api_key) or ((os.environ["KVSERVE_API_KEY"],) if os.environ.get("KVSERVE_API_KEY") else ())
    return RouterConfig(
        host=args.host, port=args.port, worker_urls=tuple(args.worker_urls),
        kv_events_endpoints=tuple(args.kv_events_endpoints), standby_workers=tuple(args.standby_workers),
        registry_file=args.registry_file, model_registry=args.model_registry, tokenizer=args.tokenizer,
        block_size=args.block_size, policy=args.policy, cache_threshold=args.cache_threshold,
        balance_abs_threshold=args.balance_abs_threshold, balance_rel_threshold=args.balance_rel_threshold,
        queue_token_cost=args.queue_token_cost, api_keys=keys, requests_per_minute=args.requests_per_minute,
        tokens_per_minute=args.tokens_per_minute, max_concurrent_requests=args.max_concurrent_requests,
        pd=args.pd, prefill_urls=tuple(u.rstrip("/") for u in args.prefill_urls),
        pd_prefill_timeout=args.pd_prefill_timeout,
        request_timeout=args.request_timeout, drain_timeout=args.drain_timeout,
        retry=RetryConfig(max_retries=args.retry_max_retries, initial_backoff=args.retry_initial_backoff_ms / 1000,
                          max_backoff=args.retry_max_backoff_ms / 1000),
        health=HealthConfig(interval=args.health_check_interval, timeout=args.health_check_timeout,
                            failure_threshold=args.health_failure_threshold,
                            success_threshold=args.health_success_threshold,
                            cb_failure_threshold=args.cb_failure_threshold, cb_open_seconds=args.cb_open_seconds,
                            load_interval=args.load_check_interval),
        scaling=ScalingConfig(target_queue_per_replica=args.target_queue_per_replica,
                              target_ttft_p90=args.target_ttft_p90, target_kv_usage=args.target_kv_usage,
                              min_replicas=args.min_replicas, max_replicas=args.max_replicas),
        log_level=getattr(args, "log_level", "info"),
    )
