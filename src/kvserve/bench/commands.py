"""The bodies of ``kvserve bench serve``, ``sweep`` and ``throughput`` (parsing is in ``cli``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

import httpx
from rich.console import Console

from kvserve.bench.cli import (
    default_result_path,
    load_samples,
    load_sweep_samples,
    load_warmup_samples,
    serve_config,
)
from kvserve.bench.prompts import load_tokenizer
from kvserve.bench.provenance import collect_provenance
from kvserve.bench.report import print_serve_table, serve_run_to_dict, write_result
from kvserve.bench.runner import run_serve
from kvserve.bench.sweep import plot_sweep, print_sweep_table, run_sweep, sweep_points
from kvserve.bench.throughput import run_throughput
from kvserve.errors import InvalidRequestError


def _workload_args(args: argparse.Namespace) -> dict:
    keys = ("dataset_name", "dataset_path", "num_prompts", "input_len", "output_len", "random_range_ratio",
            "num_groups", "prompts_per_group", "system_prompt_len", "question_len", "sharegpt_output_len", "seed")
    return {k: getattr(args, k) for k in keys}


def online_tokenizer(args: argparse.Namespace) -> Any:
    """``--tokenizer``, or the built-in model's when the server at ``--base-url`` serves it.

    Raises:
        InvalidRequestError: no ``--tokenizer`` and the server serves another model.
    """
    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    from kvserve.builtin import BUILTIN_MODEL_NAME, builtin_model_path

    served = []
    try:
        response = httpx.get(args.base_url.rstrip("/") + "/v1/models", timeout=10)
        served = [model["id"] for model in response.json().get("data", [])]
    except (httpx.HTTPError, ValueError):
        pass
    if BUILTIN_MODEL_NAME in served and args.model in (None, BUILTIN_MODEL_NAME):
        return load_tokenizer(str(builtin_model_path()))
    raise InvalidRequestError(
        f"--tokenizer is required: the server at {args.base_url} serves {served or 'an unknown model'}; "
        f"give the local folder of that model's tokenizer", param="tokenizer",
    )


def serve_command(args: argparse.Namespace) -> int:
    """One online run; prints a table, writes ``--result-file`` if given. Exit 1 if any failed."""
    config = serve_config(args, request_rate=args.request_rate, max_concurrency=args.max_concurrency)
    tokenizer = online_tokenizer(args)
    samples = load_samples(args, tokenizer)
    run = asyncio.run(run_serve(config, samples, tokenizer, load_warmup_samples(args, tokenizer)))
    print_serve_table(run)
    if args.result_file:
        payload = {"workload": _workload_args(args), **serve_run_to_dict(run)}
        path = write_result(args.result_file, "serve", payload, collect_provenance(run.server))
        print(f"result written to {path}")
    return 1 if run.metrics.failed else 0


def sweep_command(args: argparse.Namespace) -> int:
    """Online runs over the load levels; one JSON with every run, a PNG, a table."""
    points = sweep_points(args.concurrency, args.request_rates)
    percentiles = tuple(sorted(set(args.percentiles) | {50.0, 99.0}))
    base = serve_config(args, percentiles=percentiles)
    tokenizer = online_tokenizer(args)
    sample_sets = load_sweep_samples(args, tokenizer, len(points))
    runs = asyncio.run(run_sweep(base, points, sample_sets, tokenizer, load_warmup_samples(args, tokenizer)))
    result_path = args.result_file or default_result_path("sweep")
    plot_path = args.plot_file or str(result_path).rsplit(".", 1)[0] + ".png"
    plot_sweep(runs, points, plot_path)
    payload = {
        "workload": _workload_args(args),
        "plot_file": str(plot_path),
        "runs": [{"point": dataclasses.asdict(p), **serve_run_to_dict(r)} for p, r in zip(points, runs)],
    }
    write_result(result_path, "sweep", payload, collect_provenance(runs[0].server))
    print_sweep_table(runs, points)
    print(f"result written to {result_path}, plot to {plot_path}")
    return 1 if any(r.metrics.failed for r in runs) else 0


def throughput_command(args: argparse.Namespace) -> int:
    """Offline run through ``kvserve.engine.llm.LLM`` (no HTTP)."""
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    samples = load_samples(args, tokenizer)
    result = run_throughput(args.model, samples, args.engine_kwargs, args.ignore_eos, args.temperature)
    Console().print(result)
    if args.result_file:
        payload = {"workload": _workload_args(args), "model": args.model, "engine_kwargs": args.engine_kwargs,
                   "metrics": dataclasses.asdict(result)}
        path = write_result(args.result_file, "throughput", payload, collect_provenance(None))
        print(f"result written to {path}")
    return 0


COMMANDS = {"serve": serve_command, "sweep": sweep_command, "throughput": throughput_command}
