"""kvserve against its baselines in one run on this machine, with kvserve's ratio to each.

    python benchmarks/compare.py                      # full set (~20 min on a quiet 2-vCPU machine, ~20 more with vLLM)
    python benchmarks/compare.py --preset quick       # fewer prompts (~10 min), a smoke run

What runs, in order, all on the Qwen2.5-0.5B-shaped checkpoint (``make_qwen_shaped_model.py``,
made if missing), random 128-token prompts and 128 output tokens with ignore_eos:

1. ``kvserve serve`` (prefix caching on) + ``kvserve bench serve`` at concurrency 1, 8, 32, 64
   (closed loop: ``--request-rate inf --max-concurrency C``); the shared-prefix workload at
   concurrency 8; the server restarted with ``--no-enable-prefix-caching`` for the same
   shared-prefix workload.
2. transformers ``generate``: sequential (batch 1) on the concurrency-1 prompts; static batches of
   32 on the concurrency-32 prompts (``baseline_transformers.py``).
3. llama.cpp via llama-cpp-python's server at concurrency 1 and 8 on the same prompts as kvserve's
   levels (``baseline_llamacpp.py``), when ``/tmp/llamacpp-venv`` exists.
4. vLLM's CPU backend (``vllm serve`` from ``--vllm-venv``, made by ``scripts/install_vllm_cpu.sh``;
   skipped with a line saying why where it cannot run) and a second kvserve server, both up at
   once and measured alternately, case by case: concurrency 1, 16 and 64 greedy, and 64 at
   temperature 1, each case by both load generators, ``kvserve bench serve`` and real vLLM's
   ``vllm bench serve`` (from that venv); each case and generator draws prompts of its own (both
   engines cache prefixes), the same for both engines.

Each level draws its own prompts (seed 1000 + C) and its baseline draws the same ones. Every run
writes its own result file (with provenance) under ``--out``; ``summary.json`` (with provenance)
and ``summary.md`` hold the comparison table. Ratios are kvserve / baseline for throughput and
baseline / kvserve for latencies, so > 1 always means kvserve is better. Rerunning with the same
``--out`` reuses the result files already there (delete them to measure again).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from make_qwen_shaped_model import DEFAULT_OUT, make_qwen_shaped_model
from servers import bench_serve, kvserve_server
from vllm_cpu import DEFAULT_VENV, unusable, vllm_bench_serve, vllm_server

from kvserve.bench.provenance import collect_provenance
from kvserve.bench.report import write_result

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Plan:
    """Prompts per concurrency level, and the shared-prefix workload (tokens)."""

    prompts: dict[int, int]
    shared_prefix: tuple[int, int, int, int, int]  # groups, prompts per group, system, question, output
    vllm_prompts: dict[int, int]  # the cases against vLLM: prompts per concurrency
    input_len: int = 128
    output_len: int = 128


PRESETS = {
    # The shared-prefix case: 16 groups sharing a 1,024-token system prompt.
    "full": Plan({1: 4, 8: 16, 32: 64, 64: 128}, (16, 4, 1024, 32, 32), {1: 4, 16: 32, 64: 128}),
    "quick": Plan({1: 2, 8: 8, 32: 32, 64: 64}, (2, 8, 512, 32, 16), {1: 2, 16: 16, 64: 64}),
}

# The cases against vLLM: (name, concurrency, temperature).
VLLM_CASES = (("c1", 1, 0.0), ("c16", 16, 0.0), ("c64", 64, 0.0), ("c64-t1", 64, 1.0))
GENERATORS = ("kvbench", "vllmbench")  # kvserve bench serve, vllm bench serve


def seed_of(concurrency: int) -> int:
    return 1000 + concurrency


def random_workload(plan: Plan, num_prompts: int, seed: int) -> list[str]:
    return ["--dataset-name", "random", "--input-len", str(plan.input_len), "--output-len", str(plan.output_len),
            "--num-prompts", str(num_prompts), "--seed", str(seed)]


def shared_prefix_workload(plan: Plan) -> list[str]:
    g, p, s, q, o = plan.shared_prefix
    return ["--dataset-name", "shared-prefix", "--num-groups", str(g), "--prompts-per-group", str(p),
            "--system-prompt-len", str(s), "--question-len", str(q), "--output-len", str(o), "--seed", "2000"]


def load_done(out: Path, names: list[str]) -> dict[str, dict] | None:
    """The result files ``out/NAME.json`` when all exist (a rerun with the same ``--out`` resumes)."""
    paths = [out / f"{name}.json" for name in names]
    if not all(p.exists() for p in paths):
        return None
    print(f"reusing {', '.join(str(p) for p in paths)}")
    return {name: json.loads(p.read_text()) for name, p in zip(names, paths)}


def run_kvserve(plan: Plan, model: str, out: Path) -> dict[str, dict]:
    """kvserve's runs, keyed ``kvserve-cC``, ``kvserve-prefix-on``, ``kvserve-prefix-off``."""
    names = [f"kvserve-c{c}" for c in plan.prompts] + ["kvserve-prefix-on"]
    docs = load_done(out, names)
    if docs is None:
        docs = {}
        with kvserve_server(model, out / "kvserve-server.log", prefix_caching=True) as url:
            for c in plan.prompts:
                docs[f"kvserve-c{c}"] = bench_serve(url, model, out / f"kvserve-c{c}.json",
                                                    random_workload(plan, plan.prompts[c], seed_of(c)), c)
            docs["kvserve-prefix-on"] = bench_serve(url, model, out / "kvserve-prefix-on.json",
                                                    shared_prefix_workload(plan), 8)
    off = load_done(out, ["kvserve-prefix-off"])
    if off is None:
        with kvserve_server(model, out / "kvserve-server-noprefix.log", prefix_caching=False) as url:
            off = {"kvserve-prefix-off": bench_serve(url, model, out / "kvserve-prefix-off.json",
                                                     shared_prefix_workload(plan), 8)}
    return {**docs, **off}


def run_vs_vllm(plan: Plan, model: str, out: Path, venv: Path) -> dict[str, dict]:
    """Both servers up at once; each case measured by kvserve's generator on kvserve then vLLM, then
    by vLLM's on vLLM then kvserve (so neither engine always runs first); runs keyed
    ``vs-ENGINE-CASE-GENERATOR``."""
    names = [f"vs-{e}-{c}-{g}" for c, _, _ in VLLM_CASES for g in GENERATORS for e in ("kvserve", "vllm")]
    docs = load_done(out, names)
    if docs is not None:
        return docs
    reason = unusable(venv)
    if reason:
        print(f"vLLM CPU baseline skipped: {reason}")
        return {}
    docs = {}
    with vllm_server(venv, model, out / "vllm-server.log") as vllm_url, \
            kvserve_server(model, out / "kvserve-server-vs-vllm.log") as kvserve_url:
        for case, concurrency, temperature in VLLM_CASES:
            # Prompts of their own per case and generator: both engines cache prefixes, so a run that
            # repeated an earlier run's prompts would measure cache hits.
            n, seed = plan.vllm_prompts[concurrency], seed_of(concurrency) + (500 if temperature else 0)
            for engine, url in (("kvserve", kvserve_url), ("vllm", vllm_url)):
                name = f"vs-{engine}-{case}-kvbench"
                docs[name] = bench_serve(url, model, out / f"{name}.json", random_workload(plan, n, seed), concurrency,
                                         extra=["--temperature", str(temperature)])
            for engine, url in (("vllm", vllm_url), ("kvserve", kvserve_url)):
                name = f"vs-{engine}-{case}-vllmbench"
                docs[name] = vllm_bench_serve(venv, url, "qwen-shaped", model, out / f"{name}.json", plan.input_len,
                                              plan.output_len, n, concurrency, seed + 100, temperature)
    return docs


def run_script(args: list[str]) -> None:
    command = [sys.executable, *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def run_transformers(plan: Plan, model: str, out: Path) -> dict[str, dict]:
    common = [str(HERE / "baseline_transformers.py"), "--model", model, "--input-len", str(plan.input_len),
              "--output-len", str(plan.output_len)]
    if not load_done(out, ["hf-sequential"]):
        run_script([*common, "--mode", "sequential", "--num-prompts", str(plan.prompts[1]),
                    "--seed", str(seed_of(1)), "--result-file", str(out / "hf-sequential.json")])
    if not load_done(out, ["hf-static32"]):
        run_script([*common, "--mode", "static", "--batch-size", "32", "--num-prompts", str(plan.prompts[32]),
                    "--seed", str(seed_of(32)), "--result-file", str(out / "hf-static32.json")])
    return {name: json.loads((out / f"{name}.json").read_text()) for name in ("hf-sequential", "hf-static32")}


def run_llamacpp(plan: Plan, model: str, out: Path, python: str) -> dict[str, dict]:
    if not Path(python).exists():
        print(f"llama.cpp baseline skipped: {python} not found (see baseline_llamacpp.py)")
        return {}
    docs = {}
    for c in (1, 8):  # one server per level so each level's seed and prompt count match kvserve's
        if load_done(out, [f"llamacpp-c{c}"]):
            docs[f"llamacpp-c{c}"] = json.loads((out / f"llamacpp-c{c}.json").read_text())
            continue
        run_script([str(HERE / "baseline_llamacpp.py"), "--model", model, "--llamacpp-python", python,
                    "--concurrency", str(c), "--num-prompts", str(plan.prompts[c]), "--seed", str(seed_of(c)),
                    "--input-len", str(plan.input_len), "--output-len", str(plan.output_len),
                    "--result-dir", str(out)])
        docs[f"llamacpp-c{c}"] = json.loads((out / f"llamacpp-c{c}.json").read_text())
    return docs


# (label, kvserve run, baseline run)
PAIRS = (
    ("batch 1: vs transformers sequential", "kvserve-c1", "hf-sequential"),
    ("batch 1: vs llama.cpp", "kvserve-c1", "llamacpp-c1"),
    ("8 concurrent: vs llama.cpp (serializes)", "kvserve-c8", "llamacpp-c8"),
    ("32 concurrent: vs transformers static batch 32", "kvserve-c32", "hf-static32"),
    # The issue's concurrency-64 targets: transformers' static batches of 32 over the same kind of
    # requests, and llama.cpp at its own concurrency 1 and 8 (it serves one request at a time).
    ("64 concurrent: vs transformers static batch 32", "kvserve-c64", "hf-static32"),
    ("64 concurrent: vs llama.cpp at 1", "kvserve-c64", "llamacpp-c1"),
    ("64 concurrent: vs llama.cpp at 8", "kvserve-c64", "llamacpp-c8"),
    ("shared prefix c8: prefix caching on vs off", "kvserve-prefix-on", "kvserve-prefix-off"),
    *((f"{case} (temperature {t:g}): vs vLLM CPU, {'kvserve bench' if g == 'kvbench' else 'vllm bench'}",
       f"vs-kvserve-{case}-{g}", f"vs-vllm-{case}-{g}") for case, _, t in VLLM_CASES for g in GENERATORS),
)


def figures(doc: dict) -> dict[str, float]:
    if "metrics" not in doc:  # vllm bench serve's result: vLLM's flat keys (E2E only with --percentile-metrics e2el)
        return {"tok_s": doc["output_throughput"], "ttft_ms": doc["median_ttft_ms"], "tpot_ms": doc["median_tpot_ms"],
                "e2el_ms": doc.get("median_e2el_ms", float("nan")), "completed": doc["completed"],
                "failed": doc.get("failed", 0)}
    m = doc["metrics"]
    return {"tok_s": m["output_throughput"], "ttft_ms": m["ttft_ms"]["median"], "tpot_ms": m["tpot_ms"]["median"],
            "e2el_ms": m["e2el_ms"]["median"], "completed": m["completed"], "failed": m["failed"]}


def compare_rows(docs: dict[str, dict]) -> list[dict]:
    """One row per pair whose two runs exist; ratios > 1 mean kvserve (the first run) is better."""
    rows = []
    for label, ours, theirs in PAIRS:
        if ours not in docs or theirs not in docs:
            continue
        a, b = figures(docs[ours]), figures(docs[theirs])
        rows.append({"comparison": label, "kvserve_run": ours, "baseline_run": theirs, "kvserve": a, "baseline": b,
                     "throughput_ratio": a["tok_s"] / b["tok_s"],
                     "ttft_ratio": b["ttft_ms"] / a["ttft_ms"] if a["ttft_ms"] else float("nan"),
                     "tpot_ratio": b["tpot_ms"] / a["tpot_ms"] if a["tpot_ms"] else float("nan")})
    return rows


def markdown_table(rows: list[dict], docs: dict[str, dict]) -> str:
    lines = ["| comparison | kvserve tok/s | baseline tok/s | **throughput ratio** | kvserve TTFT p50 (ms) | "
             "baseline TTFT p50 (ms) | TTFT ratio | kvserve TPOT p50 (ms) | baseline TPOT p50 (ms) | TPOT ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b = r["kvserve"], r["baseline"]
        lines.append(f"| {r['comparison']} | {a['tok_s']:.1f} | {b['tok_s']:.1f} | **{r['throughput_ratio']:.2f}x** | "
                     f"{a['ttft_ms']:.0f} | {b['ttft_ms']:.0f} | {r['ttft_ratio']:.2f}x | {a['tpot_ms']:.0f} | "
                     f"{b['tpot_ms']:.0f} | {r['tpot_ratio']:.2f}x |")
    lines += ["", "| run | requests | output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | E2E p50 (ms) |",
              "|---|---|---|---|---|---|"]
    for name, doc in docs.items():
        f = figures(doc)
        lines.append(f"| {name} | {f['completed']} ok / {f['failed']} failed | {f['tok_s']:.1f} | "
                     f"{f['ttft_ms']:.0f} | {f['tpot_ms']:.0f} | {f['e2el_ms']:.0f} |")
    return "\n".join(lines) + "\n"


def environment_line(provenance, docs: dict[str, dict], preset: str, wall_s: float) -> str:
    """Commit, versions and machine of the comparison, for the top of ``summary.md``."""
    versions = {}
    for doc in docs.values():
        versions.update(doc.get("versions") or doc.get("baseline", {}).get("versions") or {})
    libs = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v and k != "torch")
    dirty = " (dirty tree)" if provenance.git_dirty else ""
    return (f"preset {preset}, wall time {wall_s / 60:.1f} min; commit {provenance.git_commit}{dirty}; "
            f"kvserve {provenance.kvserve_version}, python {provenance.python_version}, torch "
            f"{provenance.torch_version}, {libs}; {provenance.cpu_model}, {provenance.cpu_count} CPUs; "
            f"{provenance.timestamp}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="kvserve vs transformers, llama.cpp and vLLM CPU, ratios in one run")
    p.add_argument("--model", default=DEFAULT_OUT, help=f"checkpoint folder (made if missing; default {DEFAULT_OUT})")
    p.add_argument("--preset", choices=tuple(PRESETS), default="full")
    p.add_argument("--out", default=None, help="result folder (default bench_results/compare-PRESET-TIME)")
    p.add_argument("--llamacpp-python", default="/tmp/llamacpp-venv/bin/python")
    p.add_argument("--vllm-venv", type=Path, default=DEFAULT_VENV,
                   help=f"vllm-cpu's venv (scripts/install_vllm_cpu.sh; default {DEFAULT_VENV})")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: kvserve, transformers, llamacpp, vllm")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = PRESETS[args.preset]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or f"bench_results/compare-{args.preset}-{stamp}")
    out.mkdir(parents=True, exist_ok=True)
    if args.model == DEFAULT_OUT:
        make_qwen_shaped_model(args.model)
    skip = set(filter(None, args.skip.split(",")))
    started = dt.datetime.now(dt.timezone.utc)
    docs: dict[str, dict] = {}
    if "kvserve" not in skip:
        docs.update(run_kvserve(plan, args.model, out))
    if "transformers" not in skip:
        docs.update(run_transformers(plan, args.model, out))
    if "llamacpp" not in skip:
        docs.update(run_llamacpp(plan, args.model, out, args.llamacpp_python))
    if "vllm" not in skip:
        docs.update(run_vs_vllm(plan, args.model, out, args.vllm_venv))
    rows = compare_rows(docs)
    table = markdown_table(rows, docs)
    wall_s = (dt.datetime.now(dt.timezone.utc) - started).total_seconds()
    provenance = collect_provenance(None)
    (out / "summary.md").write_text(environment_line(provenance, docs, args.preset, wall_s) + "\n\n" + table)
    write_result(out / "summary.json", "compare", {"preset": args.preset, "plan": plan.__dict__, "wall_s": wall_s,
                                                   "rows": rows, "runs": sorted(docs)}, provenance)
    print(table)
    print(f"wall time {wall_s / 60:.1f} min; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
