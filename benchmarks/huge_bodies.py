"""What huge request bodies cost a server (the built-in model, ``--api-key k``): a 20 MB prompt
(refused before tokenizing), the same text to ``/tokenize`` (tokenized: it answers the count), a
body of 5M token ids (parsed and validated off the event loop where it can be, ``/health`` probed
every 20 ms meanwhile), the same body without a key (401 before the body is read), and the
server's RSS before and 10 s / 60 s after.

    python benchmarks/huge_bodies.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import KVSERVE, _stop, free_port, wait_ready  # noqa: E402
from soak import rss_mb  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    response = fn()
    return response, time.perf_counter() - start


def health_during(base: str, fn) -> tuple[httpx.Response, float, list[float]]:
    """``fn()``'s response and seconds, and ``/health`` latencies probed every 20 ms meanwhile."""
    latencies: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=base, timeout=60) as client:
            while not stop.is_set():
                _, seconds = timed(lambda: client.get("/health"))
                latencies.append(seconds)
                time.sleep(0.02)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(0.3)
    response, seconds = timed(fn)
    time.sleep(0.3)
    stop.set()
    thread.join()
    return response, seconds, latencies


def main() -> None:
    from kvserve.builtin import builtin_model_path

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = Path("/tmp/kvserve-huge-bodies.log")
    command = [*KVSERVE, "serve", str(builtin_model_path()), "--host", "127.0.0.1", "--port", str(port),
               "--api-key", "k", "--served-model-name", "m", "--uvicorn-log-level", "warning",
               "--log-stats-interval", "0"]
    proc = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(base + "/health", proc, log)
        client = httpx.Client(base_url=base, headers={"Authorization": "Bearer k"}, timeout=300)
        for _ in range(5):
            client.post("/v1/completions", json={"model": "m", "prompt": "warm up", "max_tokens": 8})
        time.sleep(2)
        baseline = rss_mb(proc.pid)
        print(f"RSS before: {baseline:.1f} MB")
        text = "word " * 4_000_000  # 20 MB
        r, s = timed(lambda: client.post("/v1/completions", json={"model": "m", "prompt": text, "max_tokens": 4}))
        print(f"20 MB prompt: {r.status_code} in {s:.2f} s")
        r, s = timed(lambda: client.post("/tokenize", json={"model": "m", "prompt": text}))
        print(f"20 MB /tokenize: {r.status_code} in {s:.2f} s ({r.json().get('count')} tokens)")
        body = json.dumps({"model": "m", "prompt": list(range(5)) * 1_000_000, "max_tokens": 4})
        headers = {"Content-Type": "application/json"}
        r, s, health = health_during(base, lambda: client.post("/v1/completions", content=body, headers=headers))
        health.sort()
        print(f"5M token ids: {r.status_code} in {s:.2f} s; /health median {health[len(health) // 2] * 1000:.0f} ms, "
              f"max {health[-1] * 1000:.0f} ms over {len(health)} probes")
        r, s = timed(lambda: httpx.post(base + "/v1/completions", content=body, headers=headers, timeout=60))
        print(f"5M token ids without a key: {r.status_code} in {s:.3f} s")
        for after, wait in ((10, 10), (60, 50)):
            time.sleep(wait)
            now = rss_mb(proc.pid)
            print(f"RSS {after} s after: {now:.1f} MB ({(now / baseline - 1) * 100:+.1f} %)")
    finally:
        _stop(proc)


if __name__ == "__main__":
    main()
