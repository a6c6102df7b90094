"""Speculative decoding: TPOT and acceptance with and without speculation, in one run.

    python benchmarks/spec_decode.py --model /tmp/qwen-shaped --dataset copy-edit --batch 1 \\
        --config none --config '{"method": "ngram", "num_speculative_tokens": 4}'

Every ``--config`` gets its own engine in this process (``none`` = no speculation); the engines
run the same prompts (a ``kvserve bench`` dataset: ``copy-edit`` or ``random``) in rounds,
alternating configs, so drift of a shared machine hits each alike. A batch of B keeps B requests in
flight (closed loop). Per request: TPOT = (finish - first token) / (output tokens - 1). Reported
per config and batch: median TPOT, its ratio to the first config's, output tokens/s, acceptance
(``spec_decode_*`` counters), and whether each greedy output equals the first config's token for
token. ``--oracle all|prefix|none`` adds a config whose drafts are the first config's own outputs (all
accepted, cut at a seeded position, or all wrong: ``kvserve.testing.spec_decode``): what verification costs
at a known acceptance on this model's shape, whatever the model's weights would copy.

The roofline beside (``roofline.py``): a step reads every weight once, so at batch 1 the bound
per token is ``t_weights / mean acceptance length``. One JSON result (``--result-file``) holds the
command, commit, versions, CPU flags and every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvserve import SamplingParams
from kvserve.bench.copy_dataset import CopyEditDataset
from kvserve.bench.datasets import RandomDataset
from kvserve.bench.provenance import collect_provenance
from kvserve.bench.roofline import decode_step_bound, model_cost
from kvserve.bench.roofline_report import engine_from_facts, probe_for
from kvserve.engine.llm import LLM
from kvserve.testing.spec_decode import ForcedProposer, reference_drafts


def cpu_flags() -> list[str]:
    """The AVX-512 / AMX flags of this CPU (what decides the kernels)."""
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2")))


def make_prompts(args, tokenizer, num_prompts: int) -> list[tuple[list[int], SamplingParams]]:
    """The dataset's prompts, each with greedy parameters for its output length (copy-edit: the
    expected answer's length unless ``--output-len``), EOS ignored so lengths are equal across
    configs."""
    rng = np.random.default_rng(args.seed)
    if args.dataset == "copy-edit":
        dataset = CopyEditDataset(args.passage_len, args.output_len, tuple(args.kinds.split(",")))
    else:
        dataset = RandomDataset(args.input_len, args.output_len or 64)
    return [(s.prompt_token_ids, SamplingParams(temperature=0, max_tokens=s.expected_output_len, ignore_eos=True))
            for s in dataset.sample(tokenizer, num_prompts, rng)]


def run_closed_loop(llm: LLM, prompts: list[tuple[list[int], SamplingParams]], batch: int,
                    tag: str) -> dict[str, Any]:
    """Every prompt once with ``batch`` requests in flight; per-request timings and tokens."""
    engine = llm.llm_engine
    stats = engine.core.scheduler.make_stats().spec_decoding
    queue = list(enumerate(prompts))
    first: dict[str, float] = {}
    done: dict[str, tuple[float, list[int]]] = {}
    tokens: dict[str, list[int]] = {}
    in_flight: set[str] = set()
    start = time.perf_counter()
    while queue or in_flight:
        while queue and len(in_flight) < batch:
            i, (prompt, params) = queue.pop(0)
            request_id = f"{tag}-{i}"
            engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            in_flight.add(request_id)
            tokens[request_id] = []
        for delta in engine.step().outputs:
            now = time.perf_counter()
            tokens[delta.request_id] += delta.outputs[0].token_ids
            if delta.outputs[0].token_ids and delta.request_id not in first:
                first[delta.request_id] = now
            if delta.finished:
                done[delta.request_id] = (now, tokens[delta.request_id])
                in_flight.discard(delta.request_id)
    wall = time.perf_counter() - start
    after = engine.core.scheduler.make_stats().spec_decoding
    tpots = [(t - first[r]) / (len(toks) - 1) for r, (t, toks) in done.items() if len(toks) > 1]
    spec = after.minus(stats) if after is not None else None
    return {"outputs": [done[f"{tag}-{i}"][1] for i in range(len(prompts))], "tpots": tpots, "wall": wall,
            "num_output_tokens": sum(len(t) for _, t in done.values()),
            "spec": None if spec is None else {"drafts": spec.num_drafts, "draft_tokens": spec.num_draft_tokens,
                                               "accepted_tokens": spec.num_accepted_tokens,
                                               "acceptance_rate": spec.acceptance_rate,
                                               "mean_acceptance_length": spec.mean_acceptance_length}}


def build_engines(args) -> dict[str, LLM]:
    engines = {}
    kwargs = dict(dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=max(args.batch), seed=0,
                  num_gpu_blocks_override=args.kv_blocks)
    for config in args.config:
        spec = None if config == "none" else json.loads(config)
        engines[config] = LLM(args.model, speculative_config=spec, **kwargs)
    for mode in args.oracle or []:
        spec = {"method": "ngram", "num_speculative_tokens": args.oracle_k}
        if not args.oracle_adaptive:
            spec.update(min_acceptance_rate=0, disable_by_batch_size=0)
        engines[f"oracle-{mode}"] = LLM(args.model, speculative_config=spec, **kwargs)
    return engines


def summarize(label: str, runs: list[dict], baseline: list[dict] | None) -> dict[str, Any]:
    tpot = statistics.median([t for r in runs for t in r["tpots"]])
    tokens = sum(r["num_output_tokens"] for r in runs)
    out = {"config": label, "median_tpot_ms": 1e3 * tpot, "output_tokens_per_s": tokens / sum(r["wall"] for r in runs)}
    specs = [r["spec"] for r in runs if r["spec"]]
    if specs:
        drafted, accepted = sum(s["draft_tokens"] for s in specs), sum(s["accepted_tokens"] for s in specs)
        drafts = sum(s["drafts"] for s in specs)
        out.update(acceptance_rate=accepted / drafted if drafted else 0.0, draft_tokens=drafted,
                   mean_acceptance_length=1 + accepted / drafts if drafts else 1.0)
    if baseline is not None:
        base = statistics.median([t for r in baseline for t in r["tpots"]])
        out["tpot_ratio"] = tpot / base
        same = [a == b for r, b_run in zip(runs, baseline) for a, b in zip(r["outputs"], b_run["outputs"])]
        out["identical_outputs"] = f"{sum(same)}/{len(same)}"
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="/tmp/qwen-shaped")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-blocks", type=int, default=1024, help="KV blocks of 16 tokens per engine")
    p.add_argument("--dataset", choices=("copy-edit", "random"), default="copy-edit")
    p.add_argument("--kinds", default="repeat,replace,spelling,continue", help="copy-edit prompt kinds")
    p.add_argument("--passage-len", type=int, default=96)
    p.add_argument("--input-len", type=int, default=128, help="random dataset")
    p.add_argument("--output-len", type=int, default=None, help="default: the answer's length (copy-edit), 64")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per batch size and round")
    p.add_argument("--batch", type=int, action="append", help="requests in flight (repeatable; default 1)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", action="append", help="'none' or a --speculative-config JSON (repeatable)")
    p.add_argument("--oracle", choices=("all", "prefix", "none"), action="append",
                   help="add an engine whose drafts are the first config's outputs: all accepted, cut at a "
                        "seeded position, or all wrong (repeatable)")
    p.add_argument("--oracle-adaptive", action="store_true",
                   help="oracle engines keep the adaptive switch's defaults (else it is off)")
    p.add_argument("--oracle-k", type=int, default=4)
    p.add_argument("--result-file", default=None)
    args = p.parse_args(argv)
    args.batch = args.batch or [1]
    args.config = args.config or ["none", '{"method": "ngram", "num_speculative_tokens": 4}']
    engines = build_engines(args)
    first = next(iter(engines.values()))
    result: dict[str, Any] = {"provenance": collect_provenance(None).to_dict(), "cpu_flags": cpu_flags(),
                              "torch_threads": torch.get_num_threads(), "args": vars(args), "points": []}
    for batch in args.batch:
        prompts = make_prompts(args, first.get_tokenizer(), args.num_prompts * batch)
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        for rnd in range(args.rounds + 1):  # round 0 warms up (and gives the oracle its drafts)
            for name, llm in engines.items():
                if name.startswith("oracle-"):
                    base = runs[args.config[0]][-1]["outputs"] if rnd else None
                    if base is None:
                        continue
                    mapping = {tuple(pr): out for (pr, _), out in zip(prompts, base)}
                    llm.llm_engine.core.proposer = ForcedProposer(
                        reference_drafts(mapping, args.oracle_k, name.removeprefix("oracle-"), seed=rnd))
                run = run_closed_loop(llm, prompts, batch, f"b{batch}r{rnd}")
                if rnd:
                    runs[name].append(run)
        base = runs[args.config[0]]
        for name, name_runs in runs.items():
            point = {"batch": batch, **summarize(name, name_runs, None if name == args.config[0] else base)}
            result["points"].append(point)
            print(json.dumps(point), flush=True)
    engine = engine_from_facts(first.llm_engine.core.serving_facts(), first.llm_engine.config.model.model)
    peaks = probe_for(engine)
    bound = decode_step_bound(model_cost(engine.arch, engine.format), peaks, engine.format.dtype, [256])
    result["roofline"] = {"peaks": peaks.to_dict(), "batch1_bound_ms": 1e3 * bound.bound_s}
    print(json.dumps(result["roofline"]), flush=True)
    path = Path(args.result_file or f"bench_results/spec_decode-{int(time.time())}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
