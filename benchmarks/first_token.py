"""Clone -> first token: the README's first command on a fresh clone, timed.

    python benchmarks/first_token.py [--repo PATH_OR_URL] [--runs 3] [--workdir /tmp/first_token]

Each run clones the repository into a new folder (so a new venv and an empty kernel cache: the
cache is keyed by the install's path), then runs the README's command exactly
(``python3 -m venv .venv && . .venv/bin/activate && bash scripts/install.sh && kvserve serve``)
and posts a one-token completion to port 8000 until one answers. It prints, per run, the seconds
from the start of ``git clone`` to: the end of the clone, the kernels' build line, the server's
ready line, and the first completion; then stops the server. pip's cache is whatever the machine
has (warm after the first install).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

README_COMMAND = "python3 -m venv .venv && . .venv/bin/activate && bash scripts/install.sh && kvserve serve"
REPO = Path(__file__).resolve().parents[1]


def first_completion(deadline: float) -> bool:
    body = json.dumps({"model": "kvserve-builtin-austen-5m", "prompt": "It is", "max_tokens": 1}).encode()
    while time.perf_counter() < deadline:
        request = urllib.request.Request("http://127.0.0.1:8000/v1/completions", body,
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200 and json.loads(response.read())["choices"][0]["text"] is not None:
                    return True
        except OSError:
            time.sleep(0.2)
    return False


def one_run(repo: str, folder: Path, timeout_s: float) -> dict[str, float | None]:
    shutil.rmtree(folder, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run(["git", "clone", "-q", repo, str(folder)], check=True)
    marks: dict[str, float | None] = {"clone": time.perf_counter() - start, "kernels_ready": None, "server_ready": None}
    process = subprocess.Popen(["bash", "-c", README_COMMAND], cwd=folder, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = (folder.parent / f"{folder.name}.log").open("w")

    def watch() -> None:
        for line in process.stdout:
            log.write(f"{time.perf_counter() - start:7.1f} {line}")
            log.flush()
            if "CPU kernels ready" in line or "CPU kernels unavailable" in line:
                marks["kernels_ready"] = time.perf_counter() - start
            if "kvserve-builtin-austen-5m" in line and ("serving" in line.lower() or "ready" in line.lower()):
                marks["server_ready"] = marks["server_ready"] or time.perf_counter() - start

    threading.Thread(target=watch, daemon=True).start()
    try:
        ok = first_completion(start + timeout_s)
        marks["first_token"] = time.perf_counter() - start if ok else None
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
        log.close()
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(REPO))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/first_token"))
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    for run in range(1, args.runs + 1):
        marks = one_run(args.repo, args.workdir / f"clone{run}", args.timeout)
        print(f"run {run}: " + ", ".join(f"{k} {v:.1f} s" if v is not None else f"{k} -" for k, v in marks.items()),
              flush=True)


if __name__ == "__main__":
    main()
