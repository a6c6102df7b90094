"""Latency targets under overload: goodput and attainment of an interactive class against offered
load, SLO-aware admission against first-come-first-served with a hand-tuned queue cap, one run.

    python benchmarks/slo_sweep.py [--model /tmp/qwen-shaped] [--loads 0.5,1,2,3] [--duration 60]

Workload: two classes arriving as two Poisson streams, half the offered load each, random prompts of
``--input-len`` token ids and ``--output-len`` tokens each (``ignore_eos``), streamed
``/v1/completions``:

- interactive: targets TTFT ``--ttft-ms`` (1,000) and TPOT ``--tpot-ms`` (100);
- batch: no target.

Modes, each with a server of its own, the loads in turn:

- ``slo``: ``kvserve serve MODEL``; interactive requests send ``X-SLO-TTFT-Ms`` / ``X-SLO-TPOT-Ms``
  (a request predicted late is refused with 429 at once);
- ``fcfs``: ``kvserve serve MODEL --max-num-waiting N``, no targets sent: today's behaviour with the
  queue cap sized by hand as vLLM's docs size theirs (target TTFT x prefill throughput / prompt
  tokens: N = ``--fcfs-cap``, default from the capacity run).

Capacity (requests per second): a closed loop of ``--capacity-concurrency`` requests of the same
shape on the slo server before the sweep. A request is *met* when the client saw TTFT <= ttft_ms
and TPOT = (last token - first token) / (tokens - 1) <= tpot_ms; *refused* = HTTP 429. Goodput =
met interactive requests per second of arrivals; attainment = met / accepted (interactive). After
the arrival window the requests still running get ``--drain`` seconds, then are cancelled (and
count as not met). The server's TTFT prediction error is read from its ``/metrics`` histogram.

Writes one JSON line per (mode, load) to ``--out`` and prints a table; ``--plot FILE`` draws
goodput and attainment against load (matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import KVSERVE, free_port, running_server  # noqa: E402


@dataclass
class Outcome:
    """One request as the client saw it."""

    cls: str
    status: int = 0
    refusal: str | None = None  # "ttft" or "tpot": what a 429 said would be missed
    ttft: float | None = None
    tpot: float | None = None
    finished: bool = False


@dataclass
class Point:
    mode: str
    load: float
    rate: float
    duration: float
    counts: dict = field(default_factory=dict)
    goodput_interactive: float = 0.0
    attainment_interactive: float | None = None
    batch_completed_per_s: float = 0.0
    ttft_error_within_15pct: float | None = None
    ttft_error_within_35pct: float | None = None


def prompt_ids(rng: random.Random, length: int, vocab: int = 151_000) -> list[int]:
    return [rng.randrange(1000, vocab) for _ in range(length)]


async def one_request(client: httpx.AsyncClient, model: str, prompt: list[int], output_len: int, cls: str,
                      headers: dict) -> Outcome:
    outcome = Outcome(cls)
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "ignore_eos": True, "temperature": 0,
            "stream": True}
    start = time.perf_counter()
    first = last = None
    tokens = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            outcome.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                if response.status_code == 429:
                    outcome.refusal = "tpot" if "decode step" in text else "ttft"
                return outcome
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    tokens += 1
        outcome.finished = True
    except (httpx.HTTPError, asyncio.CancelledError):
        return outcome
    if first is not None:
        outcome.ttft = first - start
        outcome.tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return outcome


async def closed_loop(base_url: str, model: str, concurrency: int, count: int, input_len: int, output_len: int) -> float:
    """Requests per second of a closed loop of ``count`` requests at ``concurrency``."""
    rng = random.Random(7)
    prompts = [prompt_ids(rng, input_len) for _ in range(count)]
    queue = list(prompts)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        async def worker():
            while queue:
                await one_request(client, model, queue.pop(), output_len, "batch", {})

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return count / (time.perf_counter() - start)


async def sweep_point(base_url: str, model: str, mode: str, load: float, capacity: float, args) -> Point:
    rate = load * capacity
    rng = random.Random(int(load * 1000) + 17)
    headers_interactive = {"X-SLO-TTFT-Ms": str(args.ttft_ms), "X-SLO-TPOT-Ms": str(args.tpot_ms)} if mode == "slo" else {}
    tasks: list[asyncio.Task] = []
    classes: list[str] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=None,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=64)) as client:
        before = await _error_histogram(client)
        start = time.perf_counter()
        clock = 0.0
        while True:
            clock += rng.expovariate(rate)
            if clock > args.duration:
                break
            delay = start + clock - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            cls = "interactive" if rng.random() < 0.5 else "batch"
            headers = headers_interactive if cls == "interactive" else {}
            classes.append(cls)
            tasks.append(asyncio.ensure_future(one_request(client, model, prompt_ids(rng, args.input_len),
                                                           args.output_len, cls, headers)))
        done, pending = await asyncio.wait(tasks, timeout=args.drain) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        after = await _error_histogram(client)
    outcomes = [t.result() if t in done and not t.cancelled() else Outcome(cls) for t, cls in zip(tasks, classes)]
    return summarize(mode, load, rate, args, outcomes, before, after)


def summarize(mode: str, load: float, rate: float, args, outcomes: list[Outcome], before: dict, after: dict) -> Point:
    point = Point(mode, load, rate, args.duration)

    def met(o: Outcome) -> bool:
        return o.finished and o.ttft is not None and o.ttft * 1000 <= args.ttft_ms and o.tpot * 1000 <= args.tpot_ms

    for cls in ("interactive", "batch"):
        mine = [o for o in outcomes if o.cls == cls]
        done = [o for o in mine if o.finished and o.ttft is not None]
        point.counts[cls] = {"sent": len(mine), "refused": sum(o.status == 429 for o in mine),
                             "refused_for_tpot": sum(o.refusal == "tpot" for o in mine),
                             "finished": len(done), "met": sum(met(o) for o in mine),
                             "ttft_over": sum(o.ttft * 1000 > args.ttft_ms for o in done),
                             "tpot_over": sum(o.tpot * 1000 > args.tpot_ms for o in done),
                             "ttft_p50_ms": _median([o.ttft * 1000 for o in done]),
                             "tpot_p50_ms": _median([o.tpot * 1000 for o in done]),
                             "other_errors": sum(o.status not in (0, 200, 429) for o in mine)}
    point.counts["cancelled_at_drain"] = len(outcomes) - sum(o.finished or o.status not in (0, 200) for o in outcomes)
    inter = point.counts["interactive"]
    point.goodput_interactive = inter["met"] / args.duration
    accepted = inter["sent"] - inter["refused"]
    point.attainment_interactive = inter["met"] / accepted if accepted else None
    point.batch_completed_per_s = point.counts["batch"]["finished"] / args.duration
    total = after.get("count", 0) - before.get("count", 0)
    if total > 0:
        point.ttft_error_within_15pct = (after.get(0.15, 0) - before.get(0.15, 0)) / total
        point.ttft_error_within_35pct = (after.get(0.35, 0) - before.get(0.35, 0)) / total
    return point


def _median(values: list[float]) -> float | None:
    return round(sorted(values)[len(values) // 2], 1) if values else None


async def _error_histogram(client: httpx.AsyncClient) -> dict:
    """Cumulative bucket counts of the server's TTFT prediction error (``le`` -> count, ``count``)."""
    text = (await client.get("/metrics")).text
    result: dict = {}
    for line in text.splitlines():
        if line.startswith("kvserve:slo_ttft_prediction_error_bucket"):
            le = line.split('le="')[1].split('"')[0]
            if le != "+Inf":
                result[float(le)] = float(line.split()[-1])
        elif line.startswith("kvserve:slo_ttft_prediction_error_count"):
            result["count"] = float(line.split()[-1])
    return result


def serve(model: str, port: int, log: Path, extra: list[str]):
    command = [*KVSERVE, "serve", model, "--port", str(port), "--host", "127.0.0.1", "--served-model-name", "m",
               "--disable-log-requests", *extra]
    return running_server(command, f"http://127.0.0.1:{port}/health", log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="/tmp/qwen-shaped")
    parser.add_argument("--loads", default="0.5,1,2,3")
    parser.add_argument("--modes", default="slo,fcfs")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--drain", type=float, default=60.0)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=1000.0)
    parser.add_argument("--tpot-ms", type=float, default=100.0)
    parser.add_argument("--capacity", type=float, default=None, help="requests/s (default: measured)")
    parser.add_argument("--capacity-concurrency", type=int, default=64)
    parser.add_argument("--fcfs-cap", type=int, default=None, help="--max-num-waiting of the fcfs server")
    parser.add_argument("--out", type=Path, default=Path("/tmp/slo_sweep.jsonl"))
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/slo_sweep_logs"))
    args = parser.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    points: list[Point] = []
    capacity = args.capacity
    for mode in args.modes.split(","):
        port = free_port()
        extra = [] if mode == "slo" else ["--max-num-waiting", str(args.fcfs_cap or _fcfs_cap(args, capacity))]
        with serve(args.model, port, args.log_dir / f"{mode}.log", extra):
            base = f"http://127.0.0.1:{port}"
            if capacity is None:
                capacity = asyncio.run(closed_loop(base, "m", args.capacity_concurrency, 2 * args.capacity_concurrency,
                                                   args.input_len, args.output_len))
                print(f"capacity: {capacity:.2f} requests/s (closed loop at {args.capacity_concurrency})", flush=True)
            for load in loads:
                point = asyncio.run(sweep_point(base, "m", mode, load, capacity, args))
                points.append(point)
                with args.out.open("a") as out:
                    out.write(json.dumps({**asdict(point), "capacity": capacity}) + "\n")
                print(json.dumps(asdict(point)), flush=True)
    print_table(points)
    if args.plot:
        plot(points, args.plot)


def _fcfs_cap(args, capacity: float) -> int:
    """vLLM's sizing of a queue cap: what the prefill throughput clears within the TTFT target,
    taken here as capacity x TTFT target (requests the engine starts per second, times the target)."""
    return max(1, round(capacity * args.ttft_ms / 1000))


def print_table(points: list[Point]) -> None:
    print("| mode | load | rate req/s | interactive goodput req/s | attainment (accepted) | refused | batch done/s | "
          "TTFT error <=15% / <=35% |")
    print("|---|---|---|---|---|---|---|---|")
    for p in points:
        inter = p.counts["interactive"]
        att = "-" if p.attainment_interactive is None else f"{p.attainment_interactive:.1%}"
        err = "-" if p.ttft_error_within_15pct is None else f"{p.ttft_error_within_15pct:.0%} / {p.ttft_error_within_35pct:.0%}"
        print(f"| {p.mode} | {p.load:g}x | {p.rate:.2f} | {p.goodput_interactive:.3f} | {att} | "
              f"{inter['refused']}/{inter['sent']} | {p.batch_completed_per_s:.3f} | {err} |")


def plot(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in sorted({p.mode for p in points}):
        mine = [p for p in points if p.mode == mode]
        left.plot([p.load for p in mine], [p.goodput_interactive for p in mine], marker="o", label=mode)
        right.plot([p.load for p in mine], [p.attainment_interactive or 0 for p in mine], marker="o", label=mode)
    left.set(xlabel="offered load (x capacity)", ylabel="interactive goodput (req/s)", title="goodput")
    right.set(xlabel="offered load (x capacity)", ylabel="met / accepted", title="attainment", ylim=(0, 1.05))
    for axis in (left, right):
        axis.legend()
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
