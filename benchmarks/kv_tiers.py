"""KV beyond the pool (issue 40), one run: the disk tier against recomputation, a restart, and
disaggregated prefill/decode against a colocated server on the same two cores.

    python benchmarks/make_qwen_shaped_model.py        # /tmp/qwen-shaped, once
    python benchmarks/kv_tiers.py [--model /tmp/qwen-shaped] [--out bench_results/kv_tiers.json]

1. Per block: reading one block's file from the disk tier and writing it into the cache (the page
   cache warm, and cold: the file dropped from it with posix_fadvise), against computing it (the
   prefill time per token of the no-tier run below x the block size).
2. Shared prefixes 4x the pool: ``kvserve bench serve --dataset-name prefix_repetition`` (``--prefixes``
   prefixes of ``--prefix-len`` tokens, ``--suffix-len`` unique tokens, ``--output-len`` out, one at a
   time) against a server whose pool holds a quarter of the prefixes' blocks: without a tier, then
   with ``--kv-offload-dir`` (a first pass fills it, the second is measured), then the same server
   restarted (its first requests on known prefixes). TTFT p50, and the hit rate (prefix-cache +
   disk-tier tokens over prompt tokens, from ``/metrics``) of each measured pass.
3. P/D: ``--pd-prompts`` random prompts of ``--pd-input-len`` tokens, ``--pd-output-len`` out, 16 at a
   time: one server on both cores, against a prefill instance on core 0 and a decode instance on
   core 1 (``taskset``, one thread each) behind ``kvserve route --pd``. TPOT p50/p99.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import KVSERVE, bench_serve, free_port, kvserve_command, running_server  # noqa: E402

MODEL_NAME = "qwen-shaped"


def metric_sum(base_url: str, name: str, **labels: str) -> float:
    """The sum of the series of ``kvserve:<name>`` whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(base_url + "/metrics", timeout=10).text.splitlines():
        if not line.startswith(f"kvserve:{name}{{") and not line.startswith(f"kvserve:{name} "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def hit_counters(base_url: str) -> tuple[float, float, float]:
    """(prompt tokens, tokens found in the prefix cache, tokens loaded from the disk tier)."""
    return (metric_sum(base_url, "prompt_tokens_total"), metric_sum(base_url, "prefix_cache_hits_total"),
            metric_sum(base_url, "external_prefix_cache_hits_total"))


def per_block_costs(model: str, block_size: int, blocks: int = 256) -> dict:
    """Seconds to read a block from the disk tier and write it into a cache of ``model``'s layout,
    page cache warm and cold (a random payload: the cost does not depend on the values)."""
    import numpy as np
    import torch

    from kvserve.kv_transfer.block_io import BlockCodec
    from kvserve.kv_transfer.disk_store import DiskKVStore

    config = json.loads((Path(model) / "config.json").read_text())
    layers, heads = config["num_hidden_layers"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    caches = [torch.zeros(2, blocks + 1, block_size, heads, head_dim, dtype=torch.bfloat16) for _ in range(layers)]
    codec = BlockCodec(caches)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        store = DiskKVStore(folder, "00" * 16, 1 << 40, codec.nbytes)
        for i in range(blocks):
            store.put(i + 1, rng.integers(0, 255, codec.nbytes, dtype=np.uint8))
        store.flush()
        result = {"block_bytes": codec.nbytes}
        for label in ("warm", "cold"):
            if label == "cold":
                for i in range(blocks):
                    fd = os.open(store._path(i + 1), os.O_RDONLY)
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
            start = time.perf_counter()
            for i in range(blocks):
                codec.scatter([i + 1], [store.get(i + 1)])
            result[f"load_{label}_ms"] = (time.perf_counter() - start) / blocks * 1000
        store.close()
    return result


def disk_tier(args, folder: Path) -> dict:
    blocks_per_prefix = args.prefix_len // args.block_size
    pool = max(8, args.prefixes * blocks_per_prefix // 4)  # the prefixes are 4x the pool
    workload = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(args.prefix_len),
                "--prefix-repetition-suffix-len", str(args.suffix_len), "--prefix-repetition-num-prefixes",
                str(args.prefixes), "--prefix-repetition-output-len", str(args.output_len),
                "--num-prompts", str(args.prompts), "--seed", "1", "--metric-percentiles", "50,90,99"]
    common = ["--num-gpu-blocks-override", str(pool), "--block-size", str(args.block_size), "--max-model-len",
              str(args.max_model_len)]
    tier = folder / "tier"
    runs: dict[str, dict] = {}
    for label, extra, passes in (("no_tier", [], ("fill", "measured")),
                                 ("disk_tier", ["--kv-offload-dir", str(tier)], ("fill", "measured")),
                                 ("restarted", ["--kv-offload-dir", str(tier)], ("measured",))):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with running_server(kvserve_command(args.model, port, True, [*common, *extra]), url + "/health",
                            folder / f"server-{label}.log"):
            for name in passes:
                before = hit_counters(url)
                result = bench_serve(url, args.model, folder / f"{label}-{name}.json", workload, 1, num_warmups=0)
                after = hit_counters(url)
                prompt, local, disk = (a - b for a, b in zip(after, before))
                runs[f"{label}/{name}"] = {
                    "ttft_p50_ms": result["median_ttft_ms"], "ttft_p90_ms": result["p90_ttft_ms"],
                    "prompt_tokens": prompt, "pool_hit_tokens": local, "disk_hit_tokens": disk,
                    "hit_rate": (local + disk) / prompt if prompt else 0.0}
                print(label, name, runs[f"{label}/{name}"], flush=True)
    no_tier, with_tier, restarted = runs["no_tier/measured"], runs["disk_tier/measured"], runs["restarted/measured"]
    return {"pool_blocks": pool, "prefix_blocks": args.prefixes * blocks_per_prefix, "runs": runs,
            "ttft_p50_ratio": with_tier["ttft_p50_ms"] / no_tier["ttft_p50_ms"],
            "restart_hit_rate_ratio": restarted["hit_rate"] / with_tier["hit_rate"] if with_tier["hit_rate"] else None}


def pd(args, folder: Path) -> dict:
    workload = ["--dataset-name", "random", "--random-input-len", str(args.pd_input_len), "--random-output-len",
                str(args.pd_output_len), "--num-prompts", str(args.pd_prompts), "--seed", "2",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]
    common = ["--max-model-len", str(args.max_model_len)]
    results = {}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running_server(kvserve_command(args.model, port, True, common), url + "/health", folder / "colocated.log"):
        results["colocated"] = bench_serve(url, args.model, folder / "colocated.json", workload, 16,
                                           extra=["--model", MODEL_NAME])
    producer_port, consumer_port, router_port, kv_port = free_port(), free_port(), free_port(), free_port()
    producer = ["taskset", "-c", "0", *kvserve_command(args.model, producer_port, True, [
        *common, "--cpu-threads", "1", "--kv-role", "producer", "--kv-port", str(kv_port)])]
    consumer = ["taskset", "-c", "1", *kvserve_command(args.model, consumer_port, True, [
        *common, "--cpu-threads", "1", "--kv-role", "consumer", "--kv-producers", f"127.0.0.1:{kv_port}"])]
    router = [*KVSERVE, "route", "--host", "127.0.0.1", "--port", str(router_port), "--worker-urls",
              f"http://127.0.0.1:{consumer_port}", "--pd", "--prefill-urls", f"http://127.0.0.1:{producer_port}",
              "--log-level", "warning"]
    with ExitStack() as stack:
        stack.enter_context(running_server(producer, f"http://127.0.0.1:{producer_port}/health",
                                           folder / "producer.log"))
        stack.enter_context(running_server(consumer, f"http://127.0.0.1:{consumer_port}/health",
                                           folder / "consumer.log"))
        stack.enter_context(running_server(router, f"http://127.0.0.1:{router_port}/health", folder / "router.log"))
        results["pd"] = bench_serve(f"http://127.0.0.1:{router_port}", args.model, folder / "pd.json", workload, 16,
                                    extra=["--model", MODEL_NAME])
        p2p = metric_sum(f"http://127.0.0.1:{consumer_port}", "prompt_tokens_cached_by_source_total", source="p2p")
    keys = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "output_throughput")
    summary = {mode: {k: r.get(k) for k in keys} for mode, r in results.items()}
    summary["pd"]["decode_loaded_p2p_tokens"] = p2p
    summary["tpot_p99_ratio"] = summary["pd"]["p99_tpot_ms"] / summary["colocated"]["p99_tpot_ms"]
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/tmp/qwen-shaped")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--prefixes", type=int, default=8)
    parser.add_argument("--prefix-len", type=int, default=512)
    parser.add_argument("--suffix-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--pd-input-len", type=int, default=384)
    parser.add_argument("--pd-output-len", type=int, default=64)
    parser.add_argument("--pd-prompts", type=int, default=32)
    parser.add_argument("--parts", default="blocks,disk,pd")
    parser.add_argument("--out", default="bench_results/kv_tiers.json")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    folder = Path(tempfile.mkdtemp(prefix="kv-tiers-"))
    report: dict = {"model": args.model, "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                                  capture_output=True, text=True).stdout.strip(),
                    "cpu_flags": sorted(set(re.findall(r"\b(amx\w*|avx512\w*|avx2)\b",
                                                       Path("/proc/cpuinfo").read_text())))}
    if "blocks" in parts:
        report["per_block"] = per_block_costs(args.model, args.block_size)
        print("per block", report["per_block"], flush=True)
    if "disk" in parts:
        report["disk_tier"] = disk_tier(args, folder)
        no_tier = report["disk_tier"]["runs"]["no_tier/measured"]
        tokens = args.prefix_len + args.suffix_len
        if "per_block" in report:
            report["per_block"]["compute_ms"] = no_tier["ttft_p50_ms"] / tokens * args.block_size
    if "pd" in parts:
        report["pd"] = pd(args, folder)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"logs and result files: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
