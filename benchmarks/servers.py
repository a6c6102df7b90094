"""Start and stop the servers the benchmarks measure, and run ``kvserve bench serve`` against them.

Each server is a child process of the benchmark script (its own process group, output to a log
file), awaited on ``/health`` (kvserve) or ``/v1/models`` (llama-cpp-python), and stopped with
SIGTERM, then SIGKILL after 20 s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

# The venv's ``kvserve`` script, so result files record ``kvserve bench serve ...`` as the command.
_SCRIPT = Path(sys.executable).parent / "kvserve"
KVSERVE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "kvserve.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 600.0) -> None:
    """Poll ``url`` until it answers 200.

    Raises:
        RuntimeError: the process exited, or ``timeout_s`` seconds passed (with the log's tail).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; log {log}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready at {url} after {timeout_s:.0f} s; log {log}:\n{log.read_text()[-3000:]}")


@contextmanager
def running_server(command: list[str], ready_url: str, log: Path, env: dict | None = None,
                   timeout_s: float = 600.0) -> Iterator[None]:
    """Run ``command`` until the ``with`` block ends; ``ready_url`` must answer 200 within ``timeout_s``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as log_file:
        log_file.write(" ".join(command) + "\n")
        log_file.flush()
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            wait_ready(ready_url, proc, log, timeout_s)
            yield
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def kvserve_command(model: str, port: int, prefix_caching: bool, extra: list[str] = ()) -> list[str]:
    """``kvserve serve MODEL --port N [--no-]enable-prefix-caching ...``."""
    flag = "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"
    return [*KVSERVE, "serve", model, "--host", "127.0.0.1", "--port", str(port), flag,
            "--served-model-name", "qwen-shaped", "--uvicorn-log-level", "warning", *extra]


@contextmanager
def kvserve_server(model: str, log: Path, prefix_caching: bool = True, extra: list[str] = ()) -> Iterator[str]:
    """A ``kvserve serve`` process; yields its base URL."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with running_server(kvserve_command(model, port, prefix_caching, extra), base_url + "/health", log):
        yield base_url


def bench_serve(base_url: str, tokenizer: str, result_file: Path, workload: list[str],
                max_concurrency: int, num_warmups: int = 2, extra: list[str] = ()) -> dict:
    """Run ``kvserve bench serve`` (a subprocess, so its provenance records its own command) and
    return the result JSON.

    Raises:
        subprocess.CalledProcessError: the benchmark exited non-zero (e.g. a request failed).
    """
    command = [*KVSERVE, "bench", "serve", "--base-url", base_url, "--tokenizer", tokenizer, *workload,
               "--max-concurrency", str(max_concurrency), "--num-warmups", str(num_warmups), "--ignore-eos",
               "--disable-tqdm", "--result-file", str(result_file), *extra]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return json.loads(Path(result_file).read_text())
