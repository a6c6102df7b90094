"""``kvserve route`` (the gateway process) and ``kvserve serve --data-parallel-size N`` (N engine
processes behind the same routing code on one port).

    kvserve route --worker-urls http://127.0.0.1:8001 http://127.0.0.1:8002 \\
                  --kv-events-endpoints tcp://127.0.0.1:5557 tcp://127.0.0.1:5567 --port 9000

    kvserve serve -dp 2 --port 8000
      ├─ binds :8000
      ├─ starts 2 x ``kvserve serve`` on 127.0.0.1:<free port>, each --data-parallel-rank r,
      │    --cpu-threads (cores / N) pinned to its own cores, KV events on 127.0.0.1:<free ports>
      └─ serves the router app (cache_aware) on :8000; SIGTERM stops the router, then the engines
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import uvicorn

from kvserve.errors import ConfigError
from kvserve.free_port import free_port
from kvserve.router.app import Router, build_router_app
from kvserve.router.config import RouterConfig, router_config_from_args
from kvserve.router.prompts import PromptTokenizer
from kvserve.router.registry import load_model_registry, load_worker_registry

logger = logging.getLogger(__name__)


def worker_model_folder(urls: Sequence[str], timeout_s: float = 2.0) -> str | None:
    """The first model folder on this machine that a worker's ``GET /v1/models`` reports as a
    card's ``root`` (kvserve and vLLM report the checkpoint's path), or None."""
    import httpx

    for url in urls:
        try:
            cards = httpx.get(url.rstrip("/") + "/v1/models", timeout=timeout_s).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            continue
        for card in cards if isinstance(cards, list) else []:
            root = card.get("root") if isinstance(card, dict) else None
            if isinstance(root, str) and Path(root).is_dir():
                return root
    return None


def build_tokenizers(config: RouterConfig, registry) -> dict[str | None, PromptTokenizer]:
    """One prompt tokenizer per registered model, and a default one under None: ``--tokenizer``,
    else the model folder a worker reports (:func:`worker_model_folder`), else the built-in
    model's.

    Raises:
        CheckpointError / ConfigError: a tokenizer folder cannot be loaded.
    """
    from kvserve.builtin import builtin_model_path
    from kvserve.tokenizer import load_tokenizer

    tokenizers: dict[str | None, PromptTokenizer] = {}
    if registry is not None:
        for entry in registry.models:
            if entry.tokenizer_path:
                template = Path(entry.chat_template).read_text() if entry.chat_template else None
                tokenizers[entry.name] = PromptTokenizer(load_tokenizer(entry.tokenizer_path, template), template)
    found = None if config.tokenizer else worker_model_folder(config.worker_urls)
    default = config.tokenizer or found or str(builtin_model_path())
    if config.tokenizer is None and found is None and config.worker_urls:
        logger.warning("no --tokenizer, and no worker reported a model folder on this machine (not up yet, or its "
                       "/v1/models needs a key): prefix routing hashes prompts with the built-in model's tokenizer; "
                       "give --tokenizer for the workers' model")
    logger.info("prompt tokenizer for prefix routing: %s", default)
    tokenizers[None] = PromptTokenizer(load_tokenizer(default))
    return tokenizers


def build_router(config: RouterConfig) -> Router:
    """A router with the workers of the flags and the registry file (not yet started).

    Raises:
        ConfigError: a registry file is wrong, or more event endpoints than workers.
    """
    models = load_model_registry(config.model_registry) if config.model_registry else None
    router = Router(config, build_tokenizers(config, models), models)
    if len(config.kv_events_endpoints) > len(config.worker_urls):
        raise ConfigError(f"{len(config.kv_events_endpoints)} --kv-events-endpoints for "
                          f"{len(config.worker_urls)} --worker-urls; give one per worker, in order")
    for i, url in enumerate(config.worker_urls):
        events = config.kv_events_endpoints[i] if i < len(config.kv_events_endpoints) else None
        router.add_worker(url, kv_events=events)
    for url in config.standby_workers:
        router.add_worker(url, standby=True)
    if config.registry_file:
        for entry in load_worker_registry(config.registry_file).workers:
            router.add_worker(entry.url, entry.model, entry.kv_events, entry.standby)
    if models is not None:
        for entry in models.models:
            for url in entry.workers:
                if router.fleet.get(url) is None:
                    router.add_worker(url, entry.name)
    if not router.fleet.workers:
        raise ConfigError("no workers: give --worker-urls, --registry-file or a --model-registry with workers "
                          "(or add them later with POST /workers)")
    return router


class _RouterServer(uvicorn.Server):
    """uvicorn that ends on SIGTERM/SIGINT by returning (uvicorn re-raises the signal after its
    shutdown, which would kill the process before ``kvserve serve -dp`` stops its engines)."""

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


def serve_router(router: Router, sock: socket.socket, log_level: str = "info", on_ready=None) -> None:
    """Serve the router app on a bound socket until SIGTERM/SIGINT."""
    app = build_router_app(router)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5,
                            timeout_keep_alive=30)
    server = _RouterServer(config)
    if on_ready is not None:
        original = server.startup

        async def startup(sockets=None):
            await original(sockets)
            on_ready()

        server.startup = startup
    server.run(sockets=[sock])


def run_route(args: argparse.Namespace) -> int:
    """``kvserve route``."""
    from kvserve.api.launcher import bind_socket

    config = router_config_from_args(args)
    router = build_router(config)
    sock = bind_socket(config.host, config.port)
    port = sock.getsockname()[1]

    def ready() -> None:
        print(f"kvserve route: routing {len(router.fleet.workers)} workers ({config.policy}) at "
              f"http://{config.host}:{port}/v1", flush=True)

    try:
        serve_router(router, sock, config.log_level, ready)
    finally:
        sock.close()
    return 0


# -- kvserve serve --data-parallel-size N --------------------------------------------------------

_DROP_WITH_VALUE = {"--data-parallel-size", "-dp", "--port", "--host", "--cpu-threads", "--kv-events-config",
                    "--data-parallel-rank", "-dpn"}


def child_argv(argv: list[str]) -> list[str]:
    """``argv`` of ``kvserve serve`` without the flags the parent sets per rank."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
            continue
        name = item.split("=", 1)[0]
        if name in _DROP_WITH_VALUE:
            skip = "=" not in item
            continue
        out.append(item)
    return out


def core_shares(num_ranks: int, cpus: list[int]) -> list[list[int]]:
    """Disjoint core lists, one per rank, as even as possible (a rank gets at least one core;
    with more ranks than cores, cores are shared in turn)."""
    if num_ranks <= len(cpus):
        size, extra = divmod(len(cpus), num_ranks)
        shares, start = [], 0
        for rank in range(num_ranks):
            n = size + (1 if rank < extra else 0)
            shares.append(cpus[start:start + n])
            start += n
        return shares
    return [[cpus[rank % len(cpus)]] for rank in range(num_ranks)]


def run_data_parallel(args: argparse.Namespace, argv: list[str]) -> int:
    """``kvserve serve -dp N``: see the module docstring. Returns the exit status."""
    import json

    from kvserve.api.launcher import bind_socket
    from kvserve.cpu_threads import resolve_cpu_threads

    n = args.data_parallel_size
    sock = bind_socket(args.host, args.port)
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    total = resolve_cpu_threads(args.cpu_threads)
    shares = core_shares(n, allowed[:total] if len(allowed) >= total else allowed)
    # Without --kv-events-config the ranks publish on private ipc:// sockets (rank r: "_dp<r>").
    folder = tempfile.mkdtemp(prefix="kvserve-dp-")
    events = json.loads(args.kv_events_config) if args.kv_events_config else {
        "enable_kv_cache_events": True, "endpoint": f"ipc://{folder}/events",
        "replay_endpoint": f"ipc://{folder}/replay"}
    ranks, children = [], []
    for rank in range(n):
        port = free_port()
        command = [sys.executable, "-m", "kvserve.cli", "serve", *child_argv(argv), "--host", "127.0.0.1",
                   "--port", str(port), "--cpu-threads", str(len(shares[rank])),
                   "--kv-events-config", json.dumps(events), "--data-parallel-rank", str(rank)]
        cores = shares[rank]
        children.append(subprocess.Popen(command, preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c))
                                         if hasattr(os, "sched_setaffinity") else None))
        ranks.append((f"http://127.0.0.1:{port}", _subscriber_endpoints(events, rank)))
    try:
        _wait_healthy([url for url, _ in ranks], children)
        config = RouterConfig(host=args.host, port=sock.getsockname()[1], worker_urls=tuple(u for u, _ in ranks),
                              kv_events_endpoints=tuple(e for _, e in ranks), block_size=args.block_size,
                              tokenizer=args.tokenizer or _model_folder(args),
                              api_keys=tuple(getattr(args, "api_key", []) or ()),
                              log_level=getattr(args, "log_level", "info"))
        router = build_router(config)

        def ready() -> None:
            print(f"kvserve: serving {n} data-parallel engines behind one port at "
                  f"http://{args.host}:{config.port}/v1 (cores {shares})", flush=True)

        serve_router(router, sock, config.log_level, ready)
    finally:
        sock.close()
        _stop_children(children)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def _model_folder(args: argparse.Namespace) -> str:
    from kvserve.builtin import resolve_model
    from kvserve.engine.arg_utils import model_from_args

    return resolve_model(model_from_args(args))[0]


def _subscriber_endpoints(events: dict, rank: int) -> str:
    """``pub,replay`` addresses a subscriber on this machine connects to for ``rank``."""
    from kvserve.kv_events.config import kv_events_config_from_json

    config = kv_events_config_from_json(events).for_rank(rank)

    def local(endpoint: str) -> str:
        return endpoint.replace("*", "127.0.0.1").replace("tcp://0.0.0.0", "tcp://127.0.0.1")

    replay = config.replay_endpoint
    return local(config.endpoint) + ("," + local(replay) if replay else ",")


def _wait_healthy(urls: list[str], children: list[subprocess.Popen], timeout: float = 600.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    pending = set(urls)
    while pending:
        for child in children:
            if child.poll() is not None:
                raise ConfigError(f"a data-parallel engine exited with status {child.returncode} while starting")
        for url in list(pending):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    pending.discard(url)
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise ConfigError(f"data-parallel engines not ready after {timeout:.0f} s: {sorted(pending)}")
        time.sleep(0.2)


def _stop_children(children: list[subprocess.Popen], timeout: float = 30.0) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
