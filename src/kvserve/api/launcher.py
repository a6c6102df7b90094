"""``kvserve serve``: check the command line and the model folder, bind the port, load the engine,
serve, stop the engine.

    flags ──► ServerSettings ──► bind the port (taken? one line, nothing loaded)
          └─► EngineConfig ──► start-up checks (architecture, weights, KV budget: one line each)
                           ──► AsyncLLM.deferred ──► serve(sock) ──► "serving ..." once loaded and listening

Every mistake a user can make on the command line ends before "serving" is printed, with one
``kvserve: error: ...`` line (``kvserve.cli``).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import logging
import os
import socket
import sys
import threading
from pathlib import Path

from kvserve.api.run import make_server
from kvserve.api.chat_parsers import ChatParsers
from kvserve.api.settings import ServerSettings, settings_from_args, with_model_argument_name
from kvserve.start_progress import StartProgress

logger = logging.getLogger(__name__)


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), as vLLM binds before loading.

    Made with ``IPPROTO_TCP`` named: asyncio turns Nagle's algorithm off (``TCP_NODELAY``) only on
    connections accepted from a socket whose ``proto`` says TCP. With ``proto`` 0 every response's
    first body write waited for the client's delayed ACK of the headers (~40 ms on Linux).

    Raises:
        OSError: the port is taken, not allowed, or the address is not this machine's (one line
            that says which and what to do).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise OSError(exc.errno, f"port {port} is already in use on {host} (another server listens there); "
                                     f"stop it or choose another --port") from None
        if exc.errno == errno.EACCES:
            raise OSError(exc.errno, f"not allowed to listen on {where} (ports below 1024 need privileges); "
                                     f"choose another --port") from None
        raise OSError(exc.errno, f"cannot listen on {where}: {exc.strerror}; check --host") from None
    return sock


def ready_message(served_name: str, settings: ServerSettings, seconds: float, pooling: bool | str = False) -> str:
    """What ``kvserve serve`` prints once it listens with the model loaded: where, and a request
    to paste (the key header in double quotes, so ``$KVSERVE_API_KEY`` expands in a shell); for a
    pooling model (``pooling`` True or ``embeddings``) an embeddings request, ``rerank`` a rerank
    request, ``classify`` a classification request."""
    wildcard = settings.host in ("0.0.0.0", "::", "")
    shown_host = "localhost" if wildcard else (f"[{settings.host}]" if ":" in settings.host else settings.host)
    listen = f"{settings.scheme}://{settings.host}:{settings.port}{settings.root_path}"
    base = f"{settings.scheme}://{shown_host}:{settings.port}{settings.root_path}"
    variable = settings.api_key_env or "KVSERVE_API_KEY"
    auth = f' -H "Authorization: Bearer ${variable}"' if settings.api_keys else ""
    text = "It is a truth universally acknowledged"
    route, request = {"rerank": ("rerank", {"query": "Who wrote it?", "documents": [text]}),
                      "classify": ("classify", {"input": text})}.get(str(pooling), ("v1/embeddings", {"input": text}))
    if not pooling:
        route, request = "v1/completions", {"prompt": text, "max_tokens": 32}
    body = json.dumps({"model": served_name, **request})
    lines = [
        f"kvserve: serving {served_name!r} at {listen}/v1{' (all interfaces)' if wildcard else ''} "
        f"(ready in {seconds:.1f} s)",
        f"  try:  curl {base}/{route} -H \"Content-Type: application/json\"{auth} -d '{body}'",
    ]
    if not pooling:
        lines.append(f"  chat: kvserve chat --base-url {base}/v1")
    if settings.api_keys and settings.api_key_env is None:
        lines.append("  (the key came from --api-key: export KVSERVE_API_KEY=<that key> in the client's shell)")
    return "\n".join(lines)


def _ready_route(pooler) -> bool | str:
    """What the ready line shows for a model of ``pooler`` (a ``PoolerConfig`` or None)."""
    if pooler is None:
        return False
    if pooler.task != "classify":
        return "embeddings"
    return "rerank" if pooler.classifier.num_labels == 1 else "classify"


class _LoadFailure:
    """Remembers why the engine factory failed, so it can be reported in one line."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def wrap(self, factory):
        def build_engine():
            try:
                return factory()
            except BaseException as exc:
                self.error = exc
                raise

        return build_engine

    def message(self) -> str:
        return getattr(self.error, "message", None) or str(self.error or "unknown error")


class _Announcer:
    """Prints the ready message once both the socket listens and the weights are loaded; when the
    load fails, prints one error line and stops the server."""

    def __init__(self, served_name: str, settings: ServerSettings, progress: StartProgress, engine,
                 failure: _LoadFailure) -> None:
        self.served_name, self.settings, self.progress, self.engine = served_name, settings, progress, engine
        self.failure = failure
        self.server = None
        self.failed = False
        self.ready = False

    def server_listening(self) -> None:
        threading.Thread(target=self._wait_and_print, name="kvserve-announce", daemon=True).start()

    def _stopping(self) -> bool:
        return self.server is not None and getattr(self.server, "exit_signal", None) is not None

    def _wait_and_print(self) -> None:
        self.progress.stage = f"loading {self.served_name}"  # its lines go on while the weights load
        while not self.engine.wait_until_loaded(timeout=0.25) and self.engine.loading:
            if self._stopping():
                self.progress.stop()
                return
        self.progress.stop()
        if self._stopping():
            return
        if self.engine.wait_until_loaded(timeout=0):
            self.ready = True
            pooler = getattr(getattr(self.engine, "input_processor", None), "pooler_config", None)
            print(ready_message(self.served_name, self.settings, self.progress.elapsed(), _ready_route(pooler)),
                  flush=True)
            return
        self.failed = True  # the model could not be loaded: nothing to serve
        print(f"kvserve: error: the model could not be loaded: {self.failure.message()}", file=sys.stderr, flush=True)
        self.server.should_exit = True


def run_server(args: argparse.Namespace, progress: StartProgress | None = None) -> int:
    """Serve the model named by ``args`` until SIGTERM/SIGINT; returns the exit status (0, or 2
    when the model failed to load on the engine thread, or 128 + the signal that stopped the
    server before the model was loaded). ``progress`` (made when the command started) prints a
    line at least every 2 s until the server is ready.

    ``args`` comes from the ``serve`` sub-command's parser (engine flags from
    ``kvserve.engine.arg_utils.add_engine_args``, server flags from
    ``kvserve.api.server_args.add_server_args``, observability flags from
    ``kvserve.metrics.wiring.add_observability_args``, optional positional ``model``).

    Raises:
        CheckpointError: the model folder is missing, unsupported or has no safetensors weights.
        ValueError: a flag is inconsistent (KV budget too small, empty --api-key, ...).
        OSError: the port cannot be bound.
        ImportError: ``--otlp-traces-endpoint`` given but OpenTelemetry is not installed.
    """
    from kvserve.builtin import resolve_model
    from kvserve.engine.arg_utils import model_from_args

    given = model_from_args(args)
    model, default_name = resolve_model(given)
    if getattr(args, "node_rank", 0) > 0:  # a tensor-parallel node other than 0: its ranks, no API
        return _serve_worker_node(args, model)
    progress = progress or StartProgress("starting the server")
    settings = with_model_argument_name(settings_from_args(args), given, default_name)
    settings = dataclasses.replace(settings, model_path=str(Path(model).resolve()))
    sock = bind_socket(settings.host, settings.port)
    if settings.port == 0:  # an ephemeral port: name the one the OS chose
        settings = dataclasses.replace(settings, port=sock.getsockname()[1])
    try:
        return _serve(args, model, settings, settings.served_model_name or default_name, sock, progress)
    finally:
        sock.close()


def _serve(args, model: str, settings: ServerSettings, served_name: str, sock: socket.socket,
           progress: StartProgress) -> int:
    from kvserve.engine.arg_utils import engine_config_from_args
    from kvserve.engine.async_llm import AsyncLLM
    from kvserve.engine.core import EngineCore
    from kvserve.engine.input_processor import build_input_processor
    from kvserve.metrics.log_format import configure_logging
    from kvserve.metrics.wiring import build_stats_consumers, install_metrics, observability_config_from_args
    from kvserve.tokenizer import load_tokenizer

    observability = observability_config_from_args(args)
    configure_logging(getattr(args, "log_level", "info"), observability.log_format)
    consumers = build_stats_consumers(observability, served_name)  # fails early if tracing is missing
    config = engine_config_from_args(model, args)
    arch, max_model_len = check_model(config)
    _log_sampling_defaults(config)
    tokenizer = load_tokenizer(config.model.tokenizer or model, settings.chat_template)
    ChatParsers.from_settings(settings, tokenizer)  # a parser this model cannot use stops the start here
    logger.info("loading %s (%s) for %s", model, arch.architecture, served_name)
    failure = _LoadFailure()
    input_processor = build_input_processor(config, tokenizer, arch.vocab_size, max_model_len, build_backend_now=True)
    server = None

    def on_dead(_: BaseException) -> None:  # unattributable failure: exit non-zero, let a supervisor restart
        if server is not None:
            server.should_exit = True

    publisher = _kv_event_publisher(args, config)
    async_engine = AsyncLLM.deferred(
        failure.wrap(lambda: EngineCore(config)), served_name,
        input_processor=input_processor, sampling_defaults=config.model.sampling_defaults,
        stats_consumers=consumers, on_dead=on_dead, kv_event_publisher=publisher,
        quantization=config.model.quantization.label,
    )
    async_engine.lora_registry = _lora_registry(config, arch, settings, served_name)
    announce = _Announcer(served_name, settings, progress, async_engine, failure)
    install_metrics(async_engine, prefix=observability.metrics_prefix)
    async_engine.start()  # loads the weights on the engine thread; /health is 503 until then
    server = make_server(async_engine, settings, on_ready=announce.server_listening)
    announce.server = server
    try:
        server.run(sockets=[sock])
    finally:
        async_engine.shutdown(timeout=0.0 if async_engine.loading else 10.0)  # a load in progress is abandoned
        if publisher is not None:
            publisher.shutdown()
    if announce.failed:
        return 2
    if not announce.ready and server.exit_signal is not None:
        print(f"kvserve: stopped by signal {server.exit_signal} before {served_name} was loaded", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        # Now, not at the interpreter's exit: that would wait for the load in progress (a kernel build's
        # queued units, the weights) and tear down C++ state under the engine thread still using it.
        os._exit(128 + server.exit_signal)
    if async_engine.dead_reason is not None:
        logger.error("exiting with status 1: the engine failed (%s)", async_engine.dead_reason)
        return 1
    return 0


def _serve_worker_node(args, model: str) -> int:
    """``--node-rank K > 0``: run this node's tensor-parallel ranks until the driver ends them
    (``kvserve.distributed.node``); returns 0, or 1 when a rank failed."""
    from kvserve.distributed.node import run_worker_node
    from kvserve.engine.arg_utils import engine_config_from_args
    from kvserve.metrics.log_format import configure_logging

    configure_logging(getattr(args, "log_level", "info"), "text")
    config = engine_config_from_args(model, args)
    check_model(config)
    return run_worker_node(config)


def _lora_registry(config, arch, settings: ServerSettings, served_name: str):
    """The adapters of ``--enable-lora``, with ``--lora-modules`` registered (each folder checked
    against the model), or None.

    Raises:
        LoRAAdapterError, ValueError: an adapter that cannot be served (one line naming it).
    """
    if config.lora is None:
        return None
    from kvserve.lora.peft_adapter import LoRAAdapterError
    from kvserve.lora.registry import LoRARegistry

    registry = LoRARegistry(config.lora, arch, reserved_names=(served_name, *settings.served_model_names))
    for module in settings.lora_modules:
        try:
            lora = registry.add(module.name, module.path, module.base_model_name)
        except LoRAAdapterError as exc:
            raise LoRAAdapterError(f"--lora-modules {module.name}={module.path}: {exc.message}", exc.field) from None
        logger.info("LoRA adapter %s (id %d) from %s", lora.lora_name, lora.lora_int_id, lora.lora_path)
    return registry


def _kv_event_publisher(args, config):
    """The ZMQ publisher of ``--kv-events-config`` (ports offset by ``--data-parallel-rank``), or
    None when events are off.

    Raises:
        OSError: an event endpoint cannot be bound (one line naming it).
    """
    if not config.cache.enable_kv_cache_events:
        return None
    import zmq

    from kvserve.engine.core import resolve_device
    from kvserve.kv_events.config import kv_events_config_from_json
    from kvserve.kv_events.publisher import ZmqEventPublisher

    rank = getattr(args, "data_parallel_rank", None) or 0
    kv_events = kv_events_config_from_json(args.kv_events_config).for_rank(rank)
    medium = "GPU" if resolve_device(config.model.device).type == "cuda" else "CPU"
    try:
        return ZmqEventPublisher(kv_events, medium=medium, data_parallel_rank=rank)
    except zmq.ZMQError as exc:
        raise OSError(f"--kv-events-config: cannot open {kv_events.endpoint} / {kv_events.replay_endpoint}: "
                      f"{exc}; choose other ports") from None


def check_model(config):
    """The start-up checks of ``config``'s model folder, before any weight is read: device,
    architecture, safetensors weights, ``--runner`` (``kvserve.pooling.config``), context length,
    KV budget. Returns ``(arch, max_model_len)``.

    Raises:
        CheckpointError, ValueError: one line naming the problem (``kvserve.startup_checks``).
    """
    from kvserve.engine.core import resolve_device, resolve_max_model_len
    from kvserve.model.loader import default_dtype_for_device, load_arch_config, resolve_dtype
    from kvserve.model.kv_cache_layout import kv_cache_bytes_per_block
    from kvserve.startup_checks import check_architecture, check_kv_budget, check_weights

    device = resolve_device(config.model.device)  # fail before serving when the device is missing
    check_architecture(config.model.model, config.model.hf_overrides)
    check_weights(config.model.model)
    arch = load_arch_config(config.model.model, config.model.hf_overrides)
    from kvserve.pooling.config import resolve_pooler_config
    from kvserve.pooling.engine_rules import check_pooling_options

    pooler = resolve_pooler_config(config.model, arch)  # a --runner this folder cannot take stops here
    if pooler is not None:
        check_pooling_options(config)
    max_model_len = resolve_max_model_len(arch, config.model.max_model_len, pooler and pooler.max_seq_length)
    if config.model.dtype == "auto":
        dtype = default_dtype_for_device(config.model.model, device)
    else:
        dtype = resolve_dtype(config.model.dtype, arch)
    from kvserve.distributed.shard import check_parallel_options, check_tensor_parallel

    check_tensor_parallel(arch, config.parallel.tensor_parallel_size)
    check_parallel_options(config)
    encoder = pooler is not None and pooler.encoder_only  # caches no K/V
    bytes_per_block = kv_cache_bytes_per_block(arch, config.cache.block_size, dtype, config.cache.kv_cache_dtype,
                                               0 if encoder else None)
    if config.cache.num_blocks_override is None:
        check_kv_budget(config.cache.kv_cache_memory_bytes, bytes_per_block, config.cache.block_size, max_model_len)
    return arch, max_model_len


def _log_sampling_defaults(config) -> None:
    defaults = config.model.sampling_defaults
    if defaults.as_dict():
        values = ", ".join(f"{k}={v}" for k, v in defaults.as_dict().items())
        logger.info("default sampling values from %s: %s (--generation-config vllm turns them off)",
                    defaults.source, values)
