"""Real processes on 127.0.0.1 for router tests: kvserve workers (built-in model, KV events on
private ipc:// sockets) and the ``kvserve route`` process. Every process is stopped by the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from kvserve.free_port import free_port

MODEL = "kvserve-builtin-austen-5m"


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class WorkerProcess:
    """``kvserve serve`` on the built-in model, one CPU thread, a fixed number of KV blocks."""

    def __init__(self, folder: Path, name: str, num_blocks: int = 300, port: int | None = None):
        self.folder, self.name, self.num_blocks = folder, name, num_blocks
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.events = f"ipc://{folder}/{self.port}-events"
        self.replay = f"ipc://{folder}/{self.port}-replay"
        self.process: subprocess.Popen | None = None

    @property
    def events_arg(self) -> str:
        return f"{self.events},{self.replay}"

    def command(self) -> list[str]:
        config = {"enable_kv_cache_events": True, "endpoint": self.events, "replay_endpoint": self.replay}
        return [sys.executable, "-m", "kvserve.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--num-gpu-blocks-override", str(self.num_blocks), "--cpu-threads", "1",
                "--kv-events-config", json.dumps(config), "--log-level", "warning", "--disable-log-stats",
                "--disable-uvicorn-access-log", "--shutdown-timeout", "30"]

    def start(self) -> WorkerProcess:
        log = open(self.folder / f"{self.name}.log", "ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"})
        return self

    def wait_ready(self, timeout: float = 300) -> WorkerProcess:
        wait_for(lambda: self.process.poll() is not None or healthy(self.url), timeout, f"{self.name} ready")
        assert self.process.poll() is None, (self.folder / f"{self.name}.log").read_text()[-2000:]
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def prefix_counters(self) -> tuple[float, float]:
        """(queries, hits) of the worker's prefix cache, from its /metrics."""
        from kvserve.router.monitor import parse_worker_metrics

        load = parse_worker_metrics(httpx.get(self.url + "/metrics", timeout=5).text)
        return load.prefix_queries, load.prefix_hits


class RouterProcess:
    """``kvserve route`` over ``workers`` (with their KV events)."""

    def __init__(self, folder: Path, workers: list[WorkerProcess], *extra: str, policy: str = "cache_aware",
                 env: dict[str, str] | None = None):
        self.folder, self.env = folder, env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "kvserve.cli", "route", "--host", "127.0.0.1", "--port",
                        str(self.port), "--policy", policy, "--log-level", "warning",
                        "--health-check-interval", "0.5", "--load-check-interval", "0.5"]
        if workers:
            self.command += ["--worker-urls", *[w.url for w in workers],
                             "--kv-events-endpoints", *[w.events_arg for w in workers]]
        self.command += list(extra)
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> RouterProcess:
        log = open(self.folder / f"router-{self.port}.log", "ab")
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        wait_for(lambda: self.process.poll() is not None or healthy(self.url), timeout, "router ready")
        assert self.process.poll() is None, (self.folder / f"router-{self.port}.log").read_text()[-2000:]
        return self

    def workers(self) -> dict[str, dict]:
        return {w["url"]: w for w in httpx.get(self.url + "/workers", timeout=5).json()["workers"]}

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
