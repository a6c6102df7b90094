"""The real app under uvicorn on 127.0.0.1 in a background thread, for tests."""

from __future__ import annotations

import threading
import time

from kvserve.api.run import make_server
from kvserve.api.settings import ServerSettings
from kvserve.engine.async_llm import EngineClient
from kvserve.free_port import free_port


class LoopbackServer:
    """The real app under uvicorn on 127.0.0.1 in a background thread."""

    def __init__(self, engine: EngineClient, settings: ServerSettings | None = None):
        port = free_port()
        settings = settings or ServerSettings()
        settings = ServerSettings(**{**settings.__dict__, "host": "127.0.0.1", "port": port,
                                     "log_level": "warning"})
        self.engine = engine
        self.server = make_server(engine, settings)
        self.base_url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def state(self):
        return self.server.config.app.state.serving

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
