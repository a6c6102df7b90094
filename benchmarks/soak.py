"""Soak: mixed traffic against one ``kvserve serve`` for N minutes; the server's RSS sampled, every
answer counted by kind and status. What it shows: memory stays flat after warm-up (no leak per
request), no 5xx, and the engine is idle (nothing running, waiting or holding KV) after the load.

    python benchmarks/soak.py --minutes 10            # the built-in model
    python benchmarks/soak.py --model DIR --clients 8 --minutes 2 --out soak.json

Traffic (each client loops, picking a kind at random, seeded): completions and chat, streamed or
not, ``n=2``, a ``json_object`` response format, a long prompt, a stream the client drops after
its first chunk, a bad request (400 expected), ``/tokenize``. RSS is read from
``/proc/PID/status`` every ``--sample-s`` seconds; "flat" compares the last sample with the first
one after the warm-up (the first ``--warmup-frac`` of the run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import KVSERVE, _stop, free_port, wait_ready  # noqa: E402

MODEL = "soak"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _chat(text: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 24, **extra}


KINDS = {
    "completion": ("/v1/completions", lambda r: {"model": MODEL, "prompt": f"soak {r.random()}", "max_tokens": 24}),
    "completion_stream": ("/v1/completions", lambda r: {"model": MODEL, "prompt": f"soak {r.random()}",
                                                        "max_tokens": 24, "stream": True}),
    "chat": ("/v1/chat/completions", lambda r: _chat(f"hello {r.random()}")),
    "chat_stream": ("/v1/chat/completions", lambda r: _chat(f"hi {r.random()}", stream=True,
                                                            stream_options={"include_usage": True})),
    "n2": ("/v1/completions", lambda r: {"model": MODEL, "prompt": "two ways", "max_tokens": 16, "n": 2,
                                         "temperature": 0.8}),
    "json_object": ("/v1/chat/completions", lambda r: _chat("a JSON object please", max_tokens=40,
                                                            response_format={"type": "json_object"})),
    "long_prompt": ("/v1/completions", lambda r: {"model": MODEL, "prompt": "long " * 150, "max_tokens": 8}),
    "dropped_stream": ("/v1/completions", lambda r: {"model": MODEL, "prompt": "dropped", "max_tokens": 64,
                                                     "stream": True}),
    "bad_request": ("/v1/completions", lambda r: {"model": MODEL, "prompt": "x", "max_tokens": -1}),
    "tokenize": ("/tokenize", lambda r: {"model": MODEL, "prompt": f"count these {r.random()}"}),
}


async def one(client: httpx.AsyncClient, kind: str, rng: random.Random) -> int:
    path, make = KINDS[kind]
    body = make(rng)
    if kind == "dropped_stream":
        async with client.stream("POST", path, json=body) as response:
            async for _ in response.aiter_lines():
                break
            return response.status_code
    if body.get("stream"):
        async with client.stream("POST", path, json=body) as response:
            text = "".join([line async for line in response.aiter_lines()])
            if response.status_code == 200 and "[DONE]" not in text:
                return 599  # a stream that did not end properly
            return response.status_code
    response = await client.post(path, json=body)
    return response.status_code


async def client_loop(base_url: str, seed: int, deadline: float, counts: Counter) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        while time.monotonic() < deadline:
            kind = rng.choice(list(KINDS))
            try:
                status = await one(client, kind, rng)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            counts[(kind, status)] += 1


async def sampler(pid: int, deadline: float, every: float, samples: list) -> None:
    start = time.monotonic()
    while time.monotonic() < deadline:
        samples.append((round(time.monotonic() - start, 1), round(rss_mb(pid), 1)))
        await asyncio.sleep(every)


async def soak(base_url: str, pid: int, args) -> dict:
    deadline = time.monotonic() + args.minutes * 60
    counts: Counter = Counter()
    samples: list = []
    await asyncio.gather(sampler(pid, deadline, args.sample_s, samples),
                         *(client_loop(base_url, args.seed + i, deadline, counts) for i in range(args.clients)))
    await asyncio.sleep(2)
    samples.append((round(args.minutes * 60 + 2, 1), round(rss_mb(pid), 1)))
    return {"counts": counts, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the built-in model)")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--warmup-frac", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    parser.add_argument("--log", type=Path, default=Path("/tmp/kvserve-soak.log"))
    args = parser.parse_args()
    if args.model is None:
        from kvserve.builtin import builtin_model_path

        args.model = str(builtin_model_path())
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    command = [*KVSERVE, "serve", args.model, "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", MODEL, "--uvicorn-log-level", "warning", "--log-stats-interval", "0"]
    with args.log.open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(base_url + "/health", proc, args.log)
            started = rss_mb(proc.pid)
            result = asyncio.run(soak(base_url, proc.pid, args))
            stats = httpx.get(base_url + "/metrics", timeout=10).text
        finally:
            _stop(proc)
    samples = result["samples"]
    warm = next(rss for t, rss in samples if t >= args.warmup_frac * args.minutes * 60)
    final = samples[-1][1]
    by_status: Counter = Counter()
    for (_, status), n in result["counts"].items():
        by_status[str(status)] += n
    unexpected = {f"{kind} {status}": n for (kind, status), n in result["counts"].items()
                  if status != (400 if kind == "bad_request" else 200)}
    gauges = {name: float(line.split()[-1]) for line in stats.splitlines() for name in
              ("kvserve:num_requests_running", "kvserve:num_requests_waiting", "kvserve:kv_cache_usage_perc")
              if line.startswith(name + "{")}
    summary = {
        "command": " ".join(sys.argv), "minutes": args.minutes, "clients": args.clients,
        "requests": sum(result["counts"].values()), "by_status": dict(by_status), "unexpected": unexpected,
        "by_kind": {f"{kind} {status}": n for (kind, status), n in sorted(result["counts"].items(), key=str)},
        "rss_mb": {"ready": round(started, 1), "after_warmup": warm, "final": final,
                   "max": max(rss for _, rss in samples)},
        "rss_growth_after_warmup": round(final / warm - 1, 4), "idle_after": gauges, "samples": samples,
    }
    text = json.dumps(summary, indent=1)
    if args.out:
        args.out.write_text(text)
    print(json.dumps({k: v for k, v in summary.items() if k not in ("samples", "by_kind")}, indent=1))


if __name__ == "__main__":
    main()
