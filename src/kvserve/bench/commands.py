"""The bodies of ``kvserve bench serve``, ``sweep``, ``throughput`` and ``compare`` (parsing is in ``cli``).

The environment is read here, once: ``OPENAI_API_KEY`` becomes the ``Authorization`` header, as
in vLLM's benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import httpx

from kvserve.bench.cli import (
    apply_length_flags,
    backend_api,
    base_url,
    default_result_path,
    load_samples,
    load_sweep_samples,
    load_warmup_samples,
    prepare_online_args,
    request_headers,
    serve_config,
)
from kvserve.bench.prompts import load_tokenizer
from kvserve.bench.provenance import collect_provenance
from kvserve.bench.report import print_notes, serve_run_to_dict, write_result
from kvserve.bench.roofline_report import (
    RooflineResult,
    RunEngine,
    completed_lengths,
    offline_roofline,
    online_roofline,
    probe_for,
    server_engine,
)
from kvserve.bench.runner import ServeRun, run_serve
from kvserve.bench.spec_metrics import acceptance, format_acceptance, read_counters
from kvserve.bench.sweep import plot_sweep, print_sweep_table, run_sweep, sweep_points
from kvserve.bench.throughput import format_throughput, run_throughput
from kvserve.bench.vllm_result import (
    ResultHeader,
    flat_result,
    format_summary,
    parse_key_values,
    parse_percentile_metrics,
    result_filename,
)
from kvserve.errors import InvalidRequestError

API_KEY_ENV = "OPENAI_API_KEY"


def api_key_from_environment() -> str | None:
    """The key to send: ``OPENAI_API_KEY`` (vLLM's bench), else ``KVSERVE_API_KEY`` (what
    ``kvserve serve`` tells its users to export)."""
    return os.environ.get(API_KEY_ENV) or os.environ.get("KVSERVE_API_KEY")


def _workload_args(args: argparse.Namespace) -> dict:
    keys = ("dataset_name", "dataset_path", "num_prompts", "random_input_len", "random_output_len",
            "random_range_ratio", "random_prefix_len", "num_groups", "prompts_per_group", "system_prompt_len",
            "question_len", "sharegpt_output_len", "custom_output_len", "seed")
    return {k: getattr(args, k) for k in keys}


def first_served_model(url: str, headers: dict[str, str], verify: bool) -> tuple[str, str]:
    """``(id, root)`` of the first model of ``GET /v1/models`` (root falls back to id).

    Raises:
        InvalidRequestError: the server cannot be reached or lists no model.
    """
    try:
        response = httpx.get(url + "/v1/models", headers=headers, timeout=30, verify=verify)
        response.raise_for_status()
        card = response.json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise InvalidRequestError(f"no --model given and the first model of {url}/v1/models could not be read: "
                                  f"{type(exc).__name__}: {exc}", "model") from exc
    return card["id"], card.get("root") or card["id"]


def served_model_root(url: str, model: str, headers: dict[str, str], verify: bool) -> tuple[str | None, str]:
    """``(root, "")``: the ``root`` that ``GET /v1/models`` reports for the model named ``model``,
    when it is a folder on this machine (kvserve and vLLM report the checkpoint's path there);
    else ``(None, why)``: the request failed (say a 401), no such model, or a root not here."""
    try:
        response = httpx.get(url + "/v1/models", headers=headers, timeout=30, verify=verify)
        response.raise_for_status()
        cards = response.json()["data"]
    except httpx.HTTPStatusError as exc:
        return None, f"{url}/v1/models answered {exc.response.status_code}"
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return None, f"{url}/v1/models could not be read ({type(exc).__name__}: {exc})"
    cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
    card = next((c for c in cards if c.get("id") == model), None)
    if card is None:
        return None, f"the server lists no model {model!r} (it serves: {', '.join(str(c.get('id')) for c in cards)})"
    root = card.get("root")
    if isinstance(root, str) and Path(root).is_dir():
        return root, ""
    return None, f"the server reports its root as {root!r}, not a folder on this machine"


def local_model_folder(args: argparse.Namespace, model_id: str, model_name: str,
                       headers: dict[str, str]) -> tuple[str, str]:
    """``(folder, why not)``: the served model's local folder for its tokenizer and roofline:
    ``model_id`` when it is a folder, else the server's ``root`` for ``model_name`` when that is
    one here (:func:`served_model_root`), else ``model_id`` and the reason the root was not usable."""
    if args.tokenizer or Path(model_id).is_dir():
        return model_id, ""
    root, why = served_model_root(base_url(args), model_name, headers, not args.insecure)
    return root or model_id, why


def resolve_model(args: argparse.Namespace, headers: dict[str, str]) -> tuple[str, str]:
    """vLLM's model resolution: ``(model_id, model name sent)``. With ``--model``: that, and
    ``--served-model-name`` or ``--model`` as the name; without: the server's first model (its
    ``root`` as the id, its ``id`` as the name)."""
    if args.model:
        return args.model, args.served_model_name or args.model
    print("Model not specified, fetching first model from server...")
    name, model_id = first_served_model(base_url(args), headers, not args.insecure)
    print(f"First model name: {name}, first model id: {model_id}")
    return model_id, name


def online_tokenizer(args: argparse.Namespace, model_id: str, folder: str | None = None,
                     why: str = "") -> tuple[Any, str]:
    """``(tokenizer, tokenizer_id)``: ``--tokenizer``, else ``folder`` (:func:`local_model_folder`:
    the model id or the server's ``root`` for it) when it is a local folder, else the built-in
    model's tokenizer when the server serves kvserve's built-in model. The id is vLLM's: the
    ``--tokenizer`` given, else the model id.

    Raises:
        InvalidRequestError: no local tokenizer could be found (the message says which flag to give).
    """
    options = {"trust_remote_code": args.trust_remote_code, "use_fast": args.tokenizer_mode != "slow"}
    if args.tokenizer:
        return load_tokenizer(args.tokenizer, **options), args.tokenizer
    folder = folder or model_id
    if Path(folder).is_dir():
        return load_tokenizer(folder, **options), model_id
    from kvserve.builtin import BUILTIN_MODEL_NAME, builtin_model_path

    if BUILTIN_MODEL_NAME in (model_id, Path(model_id).name):
        return load_tokenizer(str(builtin_model_path()), **options), model_id
    reason = f" ({why})" if why else ""
    raise InvalidRequestError(
        f"--tokenizer is required: the model {model_id!r} is not a local folder, and the server's /v1/models "
        f"names no folder on this machine for it{reason}; give the local folder of the served model's tokenizer",
        param="tokenizer",
    )


def _print_plan(args: argparse.Namespace) -> None:
    if "temperature" not in (args.extra_body or {}) and args.temperature is None:
        print("WARNING: vllm bench serve no longer sets temperature==0 (greedy) in requests by default. The default "
              "will be determined on the server side and can be model/API specific. For the old behavior, include "
              "--temperature=0.")
    if args.ramp_up_strategy is not None:
        print(f"Traffic ramp-up strategy: {args.ramp_up_strategy}.")
        print(f"Will increase RPS from {args.ramp_up_start_rps} to {args.ramp_up_end_rps} RPS over the duration "
              "of the benchmark.")
    else:
        print(f"Traffic request rate: {args.request_rate}")
    distribution = "Poisson process" if args.burstiness == 1.0 else "Gamma distribution"
    print(f"Burstiness factor: {args.burstiness} ({distribution})")
    print(f"Maximum request concurrency: {args.max_concurrency}")


def _save_path(args: argparse.Namespace, header: ResultHeader, run: ServeRun) -> str | None:
    if args.result_file:
        return args.result_file
    if args.save_result or args.append_result:
        return result_filename(header, run, args.result_dir, args.result_filename)
    return None


def online_rooflines(args: argparse.Namespace, model_id: str, runs: list[ServeRun]) -> tuple[list[RooflineResult],
                                                                                               dict | None]:
    """Each run against its roofline bound (``kvserve.bench.roofline_report``) and the probe's
    figures for the provenance; the machine is probed once, after the runs (the server idle)."""
    engine = None if args.no_roofline else server_engine(base_url(args), runs[0].server.version, model_id)
    peaks = probe_for(engine) if isinstance(engine, RunEngine) else None
    rooflines = [online_roofline(engine, peaks, completed_lengths(r.outputs), r.metrics.duration_s,
                                 r.config.max_concurrency) for r in runs]
    return rooflines, None if peaks is None else peaks.to_dict()


def serve_command(args: argparse.Namespace) -> int:
    """One online run: vLLM's summary, the result file (vLLM's flat keys + kvserve's), exit 1 if
    any request failed."""
    prepare_online_args(args)
    selected = parse_percentile_metrics(args.percentile_metrics)
    metadata = parse_key_values(args.metadata, "--metadata")
    headers = request_headers(args, api_key_from_environment())
    backend, _ = backend_api(args)
    model_id, model_name = resolve_model(args, headers)
    config = serve_config(args, model_name, headers)
    folder, why = local_model_folder(args, model_id, model_name, headers)
    tokenizer, tokenizer_id = online_tokenizer(args, model_id, folder, why)
    samples = load_samples(args, tokenizer)
    _print_plan(args)
    spec_before = read_counters(base_url(args), headers, not args.insecure)
    run = asyncio.run(run_serve(config, samples, tokenizer, load_warmup_samples(args, tokenizer)))
    spec = acceptance(spec_before, read_counters(base_url(args), headers, not args.insecure))
    num_prompts = args.num_prompts if args.num_prompts is not None and args.num_prompts > 0 else len(samples)
    header = ResultHeader(backend, args.label, model_id, tokenizer_id, num_prompts, metadata)
    result = flat_result(run, header, selected, args.metric_percentiles, args.save_detailed)
    print_notes(run)  # failures first, as vLLM prints them before its summary
    print(format_summary(result, selected, args.metric_percentiles))
    (roofline,), peaks = online_rooflines(args, folder, [run])
    print(roofline.line())
    if spec is not None:  # the server speculated: its acceptance over the run (warm-ups included)
        result.update(spec)
        print(format_acceptance(spec))
    path = _save_path(args, header, run)
    if path:
        payload = {**result, "workload": _workload_args(args), **serve_run_to_dict(run),
                   "roofline": roofline.to_dict()}
        written = write_result(path, "serve", payload, collect_provenance(run.server, machine_peaks=peaks),
                               append=args.append_result)
        print(f"result written to {written}")
    return 1 if run.metrics.failed else 0


def sweep_command(args: argparse.Namespace) -> int:
    """Online runs over the load levels; one JSON with every run (written first), then a PNG
    (skipped with one line when matplotlib is missing), then a table."""
    prepare_online_args(args)
    points = sweep_points(args.concurrency, args.request_rates)
    args.metric_percentiles = sorted(set(args.metric_percentiles) | {50.0, 99.0})
    headers = request_headers(args, api_key_from_environment())
    model_id, model_name = resolve_model(args, headers)
    base = serve_config(args, model_name, headers)
    folder, why = local_model_folder(args, model_id, model_name, headers)
    tokenizer, _ = online_tokenizer(args, model_id, folder, why)
    sample_sets = load_sweep_samples(args, tokenizer, len(points))
    runs = asyncio.run(run_sweep(base, points, sample_sets, tokenizer, load_warmup_samples(args, tokenizer)))
    rooflines, peaks = online_rooflines(args, folder, runs)
    result_path = Path(args.result_file or default_result_path("sweep"))
    plot_path = Path(args.plot_file or result_path.with_suffix(".png"))
    payload = {
        "workload": _workload_args(args),
        "plot_file": str(plot_path),
        "runs": [{"point": dataclasses.asdict(p), **serve_run_to_dict(r), "roofline": f.to_dict()}
                 for p, r, f in zip(points, runs, rooflines)],
    }
    write_result(result_path, "sweep", payload, collect_provenance(runs[0].server, machine_peaks=peaks))
    print(f"result written to {result_path}")
    try:
        plot_sweep(runs, points, plot_path)
        print(f"plot written to {plot_path}")
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install matplotlib)")
    print_sweep_table(runs, points, rooflines)
    if rooflines[0].bound is None:
        print(rooflines[0].line())
    return 1 if any(r.metrics.failed for r in runs) else 0


def throughput_command(args: argparse.Namespace) -> int:
    """Offline run through ``kvserve.engine.llm.LLM`` (no HTTP); the built-in model without
    ``--model``."""
    apply_length_flags(args)
    model = args.model
    if model is None:
        from kvserve.builtin import builtin_model_path

        model = str(builtin_model_path())
    tokenizer = load_tokenizer(args.tokenizer or model, trust_remote_code=args.trust_remote_code)
    samples = load_samples(args, tokenizer)
    result = run_throughput(model, samples, args.engine_kwargs, args.ignore_eos, args.temperature)
    print(format_throughput(result))
    roofline = offline_roofline(result.engine, model, result.request_lengths, result.elapsed_s, not args.no_roofline)
    print(roofline.line())
    if args.result_file:
        metrics = {k: v for k, v in dataclasses.asdict(result).items() if k != "request_lengths"}
        payload = {"workload": _workload_args(args), "model": model, "engine_kwargs": args.engine_kwargs,
                   "metrics": metrics, "roofline": roofline.to_dict()}
        peaks = None if roofline.peaks is None else roofline.peaks.to_dict()
        path = write_result(args.result_file, "throughput", payload, collect_provenance(None, machine_peaks=peaks))
        print(f"result written to {path}")
    return 0


def compare_command(args: argparse.Namespace) -> int:
    """``bench compare``: engines x levels, probes, reports (``kvserve.bench.compare``); 0 when every
    engine was measured (or skipped by its only_if), 1 when one failed."""
    from kvserve.bench.compare.analysis import write_reports
    from kvserve.bench.compare.run import Compare
    from kvserve.bench.compare.spec import load_spec
    from kvserve.bench.compare.store import Store

    spec = load_spec(args.spec)
    compare = Compare(spec, Path(args.spec).resolve(), Path(args.out), os.environ, engines=args.engines,
                      fresh=args.fresh, probes=not args.no_probes, roofline=not args.no_roofline)
    if args.report_only:
        paths = write_reports(spec, Store(args.out), compare.engines)
        print("report: " + ", ".join(str(p) for p in paths))
        return 0
    return asyncio.run(compare.run())


COMMANDS = {"serve": serve_command, "sweep": sweep_command, "throughput": throughput_command,
            "compare": compare_command}
