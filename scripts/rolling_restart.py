#!/usr/bin/env python3
"""Restart every worker behind a ``kvserve route`` one at a time, with no failed request.

For each worker (all active ones by default, in the router's order):

    1. DELETE /workers/{url} on the router: no new requests go there; returns once its in-flight
       requests finished (drain)
    2. --stop-cmd      e.g. kill -TERM $(cat /run/kvserve-{port}.pid)     (then wait until the
                       worker's /health stops answering)
    3. --start-cmd     e.g. kvserve serve --port {port} ... & echo $! > /run/kvserve-{port}.pid
                       (then wait until /health is 200)
    4. POST /workers {url, model, kv_events} on the router: back in rotation

``{url}``, ``{host}`` and ``{port}`` in the commands are replaced by the worker's (other braces,
e.g. a JSON flag, are left alone). Commands run in ``bash -c``.

    python scripts/rolling_restart.py --router http://127.0.0.1:9000 \\
        --stop-cmd 'kill -TERM $(cat /tmp/w{port}.pid)' \\
        --start-cmd 'nohup kvserve serve --port {port} > /tmp/w{port}.log 2>&1 & echo $! > /tmp/w{port}.pid'
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from urllib.parse import quote, urlsplit

import httpx


def _health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def _run(template: str, url: str) -> None:
    parts = urlsplit(url)
    command = template.replace("{url}", url).replace("{host}", parts.hostname).replace("{port}", str(parts.port))
    subprocess.run(["bash", "-c", command], check=True)


def restart_one(router: str, worker: dict, stop_cmd: str, start_cmd: str, timeout: float, headers: dict) -> None:
    url = worker["url"]
    print(f"draining {url}", flush=True)
    drained = httpx.delete(f"{router}/workers/{quote(url, safe='')}", headers=headers, timeout=timeout).json()
    if not drained.get("drained"):
        raise RuntimeError(f"{url} still had {drained.get('in_flight_left')} requests in flight after the drain")
    _run(stop_cmd, url)
    _wait(lambda: not _health(url), timeout, f"{url} to stop")
    print(f"starting {url}", flush=True)
    _run(start_cmd, url)
    _wait(lambda: _health(url), timeout, f"{url} to be ready")
    body = {"url": url, "model": worker.get("model"), "kv_events": worker.get("kv_events")}
    added = httpx.post(f"{router}/workers", json=body, headers=headers, timeout=30).json()
    if not added.get("routable"):
        raise RuntimeError(f"the router did not take {url} back: {added}")
    print(f"{url} is back in rotation", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", required=True, help="the router's URL, e.g. http://127.0.0.1:9000")
    parser.add_argument("--stop-cmd", required=True)
    parser.add_argument("--start-cmd", required=True)
    parser.add_argument("--worker", action="append", default=None, help="only these workers (repeat)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per drain, stop and start")
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    router = args.router.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    workers = httpx.get(router + "/workers", headers=headers, timeout=30).json()["workers"]
    chosen = [w for w in workers if w["state"] == "active" and (args.worker is None or w["url"] in args.worker)]
    for worker in chosen:
        restart_one(router, worker, args.stop_cmd, args.start_cmd, args.timeout, headers)
    print(f"restarted {len(chosen)} workers", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
