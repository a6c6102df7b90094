"""Run the OpenAI-compatible server under uvicorn with a graceful shutdown.

On the first SIGTERM/SIGINT the server keeps listening but stops admission (new generation
requests get 503, ``/health`` turns 503 so load balancers drain it), lets running requests
finish for up to ``settings.shutdown_timeout`` seconds, then exits. A second signal exits now.

    SIGTERM ──► accepting=False ──► in_flight == 0 or deadline ──► uvicorn shutdown ──► exit
"""

from __future__ import annotations

import logging
from collections.abc import Callable
import time
from typing import TYPE_CHECKING

import uvicorn

from kvserve.api.http_protocol import guarded_h11_protocol
from kvserve.api.serving_base import ServingState
from kvserve.api.server import build_app
from kvserve.api.settings import ServerSettings

if TYPE_CHECKING:
    from kvserve.engine.async_llm import EngineClient

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first exit signal drains instead of stopping at once."""

    def __init__(self, config: uvicorn.Config, state: ServingState, shutdown_timeout: float,
                 on_ready: Callable[[], None] | None = None):
        super().__init__(config)
        self.state = state
        self.shutdown_timeout = shutdown_timeout
        self.drain_deadline: float | None = None
        self.cut_off = False
        self.on_ready = on_ready
        self.exit_signal: int | None = None  # the first exit signal received

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    def handle_exit(self, sig: int, frame) -> None:
        if self.exit_signal is None:
            self.exit_signal = sig
        if self.drain_deadline is None:
            logger.info("signal %s: draining %d running requests (at most %.0f s)",
                        sig, self.state.in_flight, self.shutdown_timeout)
            self.state.accepting = False
            self.drain_deadline = time.monotonic() + self.shutdown_timeout
            return
        super().handle_exit(sig, frame)  # second signal: stop now

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self.drain_deadline is None:
            return False
        if self.state.in_flight == 0:
            return True
        now = time.monotonic()
        if now >= self.drain_deadline and not self.cut_off:
            # Time is up: end the remaining streams with an error event and [DONE] (rather than
            # a cut connection), then give the handlers a moment to send them.
            logger.warning("shutdown timeout: ending %d running requests", self.state.in_flight)
            abort_all = getattr(self.state.engine, "abort_all", None)
            if abort_all is not None:
                abort_all("the server shut down before this request finished")
            self.cut_off = True
            self.drain_deadline = now + 2.0
            return False
        return now >= self.drain_deadline


def make_server(engine: EngineClient, settings: ServerSettings,
                on_ready: Callable[[], None] | None = None) -> DrainingServer:
    """A configured, not yet started server (``await server.serve()`` or ``server.run()``, with
    ``sockets=[sock]`` to serve an already bound socket); ``on_ready`` is called once the socket
    listens. HTTP/1.1 runs on h11 with a header deadline (``kvserve.api.http_protocol``)."""
    app = build_app(engine, settings)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=settings.access_log,
        timeout_graceful_shutdown=1, timeout_keep_alive=settings.timeout_keep_alive,
        http=guarded_h11_protocol(settings.header_read_timeout),
        h11_max_incomplete_event_size=settings.h11_max_incomplete_event_size,
        ssl_keyfile=settings.ssl_keyfile, ssl_certfile=settings.ssl_certfile, ssl_ca_certs=settings.ssl_ca_certs,
        ssl_cert_reqs=settings.ssl_cert_reqs, ssl_ciphers=settings.ssl_ciphers or "TLSv1",
    )
    return DrainingServer(config, app.state.serving, settings.shutdown_timeout, on_ready)


def serve(engine: EngineClient, settings: ServerSettings, on_ready: Callable[[], None] | None = None) -> None:
    """Serve ``engine`` until SIGTERM/SIGINT, then drain and return (blocks the calling thread)."""
    make_server(engine, settings, on_ready).run()
