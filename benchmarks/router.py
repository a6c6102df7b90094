"""Benchmarks of ``kvserve route`` (docs/benchmarks.md, section 5.6 "Router"), all in one run:

1. policies: 3 workers (built-in model, --num-gpu-blocks-override B each) behind the router, the
   shared-prefix workload per policy (a new seed per policy = new prefixes, cold caches), beside a
   single worker with 3B blocks: fleet prefix-cache hit rate (the workers' own counters), request
   latency p50/p99, TTFT, throughput.
2. router overhead at concurrency 1 and 32: TTFT and latency through the router minus direct to
   the same worker, runs alternated (direct, router, floor, direct, ...), on a scripted zero-work
   worker (the router's own cost), with the router process's CPU time per request, beside the
   floor of any Python hop (benchmarks/router_floor_relay.py: a byte-copying TCP relay); then at
   c32 on a kvserve worker. ``--variant NAME=PYTHONPATH`` runs routers from other source trees
   in the same rounds (before/after comparisons in one run).

    python benchmarks/router.py --out bench_results/router.json
    python benchmarks/router.py --skip-policies --variant before=/tmp/old/src --variant after=$PWD/src
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "router"))
from fleet_helpers import MODEL, RouterProcess, WorkerProcess, free_port, healthy, wait_for  # noqa: E402

KVSERVE = [sys.executable, "-m", "kvserve.cli"]


def bench(base: str, folder: Path, *args: str) -> dict:
    result = folder / f"bench-{free_port()}.json"
    command = [*KVSERVE, "bench", "serve", "--base-url", base, "--model", MODEL, "--disable-tqdm",
               "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
               "--result-file", str(result), *args]
    run = subprocess.run(command, capture_output=True, text=True)
    if not result.exists():
        raise RuntimeError(run.stdout[-2000:] + run.stderr[-2000:])
    return json.loads(result.read_text())


def counters(workers) -> tuple[float, float]:
    pairs = [w.prefix_counters() for w in workers]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def summary(result: dict) -> dict:
    keys = ("completed", "failed", "duration", "request_throughput", "output_throughput", "mean_ttft_ms",
            "p50_ttft_ms", "p99_ttft_ms", "p50_e2el_ms", "p90_e2el_ms", "p99_e2el_ms", "mean_e2el_ms")
    return {k: result.get(k) for k in keys}


def policies(folder: Path, blocks: int, groups: int, per_group: int, concurrency: int) -> dict:
    workers = [WorkerProcess(folder, f"w{i}", blocks) for i in range(3)]
    single = WorkerProcess(folder, "single", 3 * blocks)
    for w in (*workers, single):
        w.start()
    out = {}
    workload = ["--dataset-name", "shared-prefix", "--num-groups", str(groups), "--prompts-per-group",
                str(per_group), "--system-prompt-len", "160", "--question-len", "32", "--output-len", "32",
                "--max-concurrency", str(concurrency)]
    try:
        for w in (*workers, single):
            w.wait_ready()
        before = counters([single])
        result = bench(single.url, folder, *workload, "--seed", "1000")
        after = counters([single])
        out["single"] = {**summary(result), "hit_rate": (after[1] - before[1]) / (after[0] - before[0])}
        for seed, policy in enumerate(("cache_aware", "least_load", "round_robin", "power_of_two"), start=1001):
            router = RouterProcess(folder, workers, policy=policy).start()
            try:
                wait_for(lambda: all(w["routable"] for w in router.workers().values()), 30, "routable")
                before = counters(workers)
                result = bench(router.url, folder, *workload, "--seed", str(seed))
                after = counters(workers)
                out[policy] = {**summary(result), "hit_rate": (after[1] - before[1]) / (after[0] - before[0])}
            finally:
                router.stop()
            print(policy, out[policy], flush=True)
    finally:
        for w in (*workers, single):
            w.stop()
    return out


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (``/proc/PID/stat``, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FloorRelay:
    """benchmarks/router_floor_relay.py in front of ``target_port``."""

    def __init__(self, target_port: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("router_floor_relay.py")),
                                         str(self.port), str(target_port)])
        wait_for(lambda: healthy(self.url), 30, "floor relay")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(10)


def start_hops(folder: Path, url: str, variants: list[tuple[str, str | None]], floor: bool) -> dict:
    """name -> (base url, process) of each router variant (its own PYTHONPATH) and the floor relay."""
    hops = {}
    for name, pythonpath in variants:
        env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
        router = RouterProcess(folder, [], "--worker-urls", url, env=env).start()
        wait_for(lambda: all(w["routable"] for w in router.workers().values()), 30, "routable")
        hops[name] = (router.url, router)
    if floor:
        relay = FloorRelay(int(url.rsplit(":", 1)[1]))
        hops["floor_tcp_relay"] = (relay.url, relay)
    return hops


def overhead(folder: Path, url: str, rounds: int, num_prompts: int, concurrency: int, hops: dict) -> dict:
    """Direct and each hop in turn, ``rounds`` times: TTFT/latency minus direct, the hop's CPU."""
    workload = ["--dataset-name", "random", "--input-len", "64", "--output-len", "16", "--num-prompts",
                str(num_prompts), "--max-concurrency", str(concurrency)]
    bench(url, folder, *workload, "--seed", "1")  # warm-up
    rows = {"direct": [], **{name: [] for name in hops}}
    for r in range(rounds):
        for kind, (base, process) in (("direct", (url, None)), *hops.items()):
            before = process_cpu_seconds(process.process.pid) if process else 0.0
            row = summary(bench(base, folder, *workload, "--seed", str(10 + r)))
            if process:
                row["hop_cpu_ms_per_request"] = 1000 * (process_cpu_seconds(process.process.pid) - before) \
                    / max(1, row["completed"])
            rows[kind].append(row)
    out = {"concurrency": concurrency, "rounds": rows, "hop_minus_direct_ms": {}}
    for name in hops:
        diff = {m: [b[m] - a[m] for a, b in zip(rows["direct"], rows[name])]
                for m in ("mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_e2el_ms")}
        cpu = [row["hop_cpu_ms_per_request"] for row in rows[name]]
        out["hop_minus_direct_ms"][name] = {
            **{m: {"mean": statistics.mean(v), "min": min(v), "max": max(v)} for m, v in diff.items()},
            "hop_cpu_ms_per_request": {"mean": statistics.mean(cpu), "min": min(cpu), "max": max(cpu)}}
    print(f"c{concurrency}", json.dumps(out["hop_minus_direct_ms"], indent=1), flush=True)
    return out


def overhead_zero_work(folder: Path, args, variants) -> dict:
    fake = subprocess.Popen([sys.executable, str(Path(__file__).with_name("router_fake_worker.py")),
                             str(port := free_port())])
    url = f"http://127.0.0.1:{port}"
    hops = {}
    try:
        wait_for(lambda: healthy(url), 30, "fake worker")
        hops = start_hops(folder, url, variants, floor=True)
        return {f"c{c}": overhead(folder, url, args.rounds, args.overhead_prompts, c, hops)
                for c in args.overhead_concurrency}
    finally:
        for _, process in hops.values():
            process.stop()
        fake.send_signal(signal.SIGTERM)
        fake.wait(10)


def overhead_kvserve_worker(folder: Path, args, variants) -> dict:
    worker = WorkerProcess(folder, "solo", 2000).start().wait_ready()
    hops = {}
    try:
        hops = start_hops(folder, worker.url, variants[-1:], floor=False)
        return {"c32": overhead(folder, worker.url, args.rounds, args.overhead_prompts, 32, hops)}
    finally:
        for _, process in hops.values():
            process.stop()
        worker.stop()


def parse_variant(text: str) -> tuple[str, str | None]:
    name, _, pythonpath = text.partition("=")
    return name, pythonpath or None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench_results/router.json")
    parser.add_argument("--blocks", type=int, default=300)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--prompts-per-group", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--overhead-prompts", type=int, default=256)
    parser.add_argument("--overhead-concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--variant", action="append", type=parse_variant, default=[],
                        help="NAME=PYTHONPATH: a router run from that source tree (repeatable; default: this "
                             "one); the kvserve-worker comparison uses the last")
    parser.add_argument("--skip-policies", action="store_true")
    parser.add_argument("--skip-kvserve-worker", action="store_true")
    args = parser.parse_args()
    variants = args.variant or [("router", None)]
    folder = Path(tempfile.mkdtemp(prefix="kvserve-router-bench-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
    report = {"commit": commit, "argv": sys.argv, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
              "amx": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags}
    if not args.skip_policies:
        report["policies"] = policies(folder, args.blocks, args.groups, args.prompts_per_group, args.concurrency)
    report["overhead_zero_work_worker"] = overhead_zero_work(folder, args, variants)
    if not args.skip_kvserve_worker:
        report["overhead_kvserve_worker"] = overhead_kvserve_worker(folder, args, variants)
    report["loadavg_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
