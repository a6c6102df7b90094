"""``kvserve bench {serve,sweep,throughput,compare}``: argument parsing and the flags-to-config step.

``serve`` accepts ``vllm bench serve`` command lines unchanged (flags in :mod:`kvserve.bench.flags`,
refusals in :mod:`kvserve.bench.refused`); the command bodies are in :mod:`kvserve.bench.commands`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from kvserve.bench.arrivals import RampUp
from kvserve.bench.datasets import SampleRequest, get_dataset
from kvserve.bench.flags import DEFAULT_NUM_PROMPTS, add_dataset_args, add_online_args, add_refused_args, \
    add_throughput_args
from kvserve.bench.metrics import parse_goodput
from kvserve.bench.refused import CHAT_BACKENDS, COMPLETIONS_BACKENDS, check_refused
from kvserve.bench.runner import ServeConfig
from kvserve.bench.vllm_result import parse_key_values
from kvserve.errors import InvalidRequestError

SAMPLING_FLAGS = ("top_p", "top_k", "min_p", "temperature", "frequency_penalty", "presence_penalty",
                  "repetition_penalty")
OUTPUT_LEN_DESTS = ("random_output_len", "sharegpt_output_len", "custom_output_len", "spec_bench_output_len",
                    "prefix_repetition_output_len")
FILE_DATASETS = ("jsonl", "sharegpt", "custom", "spec_bench")
SWEEP_SEED_STRIDE = 100  # point i of a sweep draws its prompts with seed --seed + 100 * i


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` with ``serve``, ``sweep``, ``throughput`` and ``compare`` to an ``add_subparsers()`` object;
    the parsed namespace's ``bench_command`` names the subcommand. Run it with :func:`run_bench`."""
    bench = subparsers.add_parser("bench", help="benchmark a server (serve, sweep) or the engine (throughput)")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    add_compare_parser(sub)
    for name, help_text in (("serve", "one online run against an OpenAI-compatible server "
                                      "(takes vllm bench serve's flags)"),
                            ("sweep", "online runs over several concurrencies / request rates"),
                            ("throughput", "offline: the in-process engine, all prompts at once")):
        p = sub.add_parser(name, help=help_text)
        if name == "throughput":
            add_throughput_args(p)
        else:
            add_online_args(p, sweep=name == "sweep")
            add_refused_args(p)
        add_dataset_args(p)
    return bench


def add_compare_parser(sub: Any) -> argparse.ArgumentParser:
    """``bench compare``: the engine-selection procedure from a workload spec (docs/bench_compare.md)."""
    p = sub.add_parser("compare", help="every engine x load level of a workload spec, failure probes, capacity "
                                       "and an HTML report")
    p.add_argument("--spec", required=True, help="the workload spec (YAML; docs/bench_compare.md)")
    p.add_argument("--out", required=True, help="output folder; finished cells and probes there are kept (resume)")
    p.add_argument("--engines", nargs="+", default=None, metavar="NAME", help="only these engines of the spec")
    p.add_argument("--fresh", action="store_true", help="measure everything again, ignoring stored cells")
    p.add_argument("--no-probes", action="store_true", help="load levels only, no failure-mode probes")
    p.add_argument("--report-only", action="store_true", help="write the reports from the stored files only")
    p.add_argument("--no-roofline", action="store_true",
                   help="skip the machine probe and each cell's fraction of the roofline bound")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser of ``python -m kvserve.bench``."""
    parser = argparse.ArgumentParser(prog="kvserve")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def apply_length_flags(args: argparse.Namespace) -> None:
    """vLLM's general length flags: ``--input-len`` sets ``--random-input-len``, ``--output-len``
    every dataset's output length; ``--num-prompts`` defaults to 1000 except for kvserve's jsonl
    (the whole file) and shared-prefix (its G x P prompts)."""
    if args.input_len is not None:
        args.random_input_len = args.input_len
    if args.output_len is not None:
        for dest in OUTPUT_LEN_DESTS:
            setattr(args, dest, args.output_len)
    if args.num_prompts is None and args.dataset_name not in ("jsonl", "shared-prefix"):
        args.num_prompts = DEFAULT_NUM_PROMPTS


def load_samples(args: argparse.Namespace, tokenizer: Any, seed_offset: int = 0) -> list[SampleRequest]:
    """The workload named by the dataset flags, seeded by ``--seed + seed_offset``."""
    rng = np.random.default_rng(args.seed + seed_offset)
    return get_dataset(args).sample(tokenizer, args.num_prompts, rng)


def load_sweep_samples(args: argparse.Namespace, tokenizer: Any, num_points: int) -> list[list[SampleRequest]]:
    """One workload per sweep point. Generated workloads get fresh prompts per point (seed
    ``--seed + 100 * i``) so no point is served from prefix-cache blocks of an earlier one; file
    workloads can only repeat the same prompts."""
    if args.dataset_name in FILE_DATASETS:
        return [load_samples(args, tokenizer)] * num_points
    return [load_samples(args, tokenizer, SWEEP_SEED_STRIDE * i) for i in range(num_points)]


def load_warmup_samples(args: argparse.Namespace, tokenizer: Any) -> list[SampleRequest] | None:
    """``--num-warmups`` prompts of the same workload drawn with seed ``--seed + 1``, so that
    generated workloads do not warm the server's prefix cache for the measured prompts. File
    workloads reuse their first prompts (whose prefixes may then be cached). None when no warmups."""
    if args.num_warmups <= 0:
        return None
    dataset = get_dataset(args)
    rng = np.random.default_rng(args.seed + 1)
    if args.dataset_name in FILE_DATASETS:
        return dataset.sample(tokenizer, None, rng)[: args.num_warmups]
    return dataset.sample(tokenizer, args.num_warmups, rng)


def base_url(args: argparse.Namespace) -> str:
    """``--base-url``, else ``http://HOST:PORT`` (an IPv6 host in brackets)."""
    if args.base_url:
        return args.base_url.rstrip("/")
    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    return f"http://{host}:{args.port}"


def backend_api(args: argparse.Namespace) -> tuple[str, str]:
    """``(backend, api)``: ``--backend`` (default: ``openai-chat`` for a chat endpoint, else
    ``openai``) and the payload it sends.

    Raises:
        InvalidRequestError: an unknown backend, or an endpoint the backend cannot post to (vLLM's
            check: completions backends need a path ending in ``completions``, chat ones
            ``chat/completions``).
    """
    backend = args.backend or ("openai-chat" if args.endpoint.rstrip("/").endswith("chat/completions") else "openai")
    if backend in CHAT_BACKENDS:
        api, suffix = "chat", "chat/completions"
    elif backend in COMPLETIONS_BACKENDS:
        api, suffix = "completions", "completions"
    else:
        known = ", ".join(COMPLETIONS_BACKENDS + CHAT_BACKENDS)
        raise InvalidRequestError(f"unknown --backend {backend!r}; kvserve bench serve takes {known}", "backend")
    if not args.endpoint.rstrip("/").endswith(suffix):
        raise InvalidRequestError(f"--backend {backend} posts to an endpoint ending in {suffix}, got --endpoint "
                                  f"{args.endpoint}", "endpoint")
    return backend, api


def request_headers(args: argparse.Namespace, api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer`` with ``api_key`` (vLLM reads ``OPENAI_API_KEY``), then
    ``--header KEY=VALUE`` pairs, which win."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    headers.update(parse_key_values(args.header, "--header"))
    return headers


def extra_body(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags that were given, then ``--extra-body`` (which wins), as vLLM."""
    sampling = {name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name) is not None}
    return {**sampling, **(args.extra_body or {})}


def _check_counts(args: argparse.Namespace) -> None:
    if any(not 0 <= p <= 100 for p in args.metric_percentiles):
        raise InvalidRequestError(f"percentiles must be in [0, 100], got {args.metric_percentiles}",
                                  "metric_percentiles")
    if args.num_warmups < 0:
        raise InvalidRequestError(f"--num-warmups must be >= 0, got {args.num_warmups}", "num_warmups")
    if args.duration is not None and not args.duration > 0:
        raise InvalidRequestError(f"--duration must be > 0 seconds, got {args.duration}", "duration")


def _ramp_up(args: argparse.Namespace) -> RampUp | None:
    strategy = getattr(args, "ramp_up_strategy", None)
    if strategy is None:
        return None
    if args.ramp_up_start_rps is None or args.ramp_up_end_rps is None:
        raise InvalidRequestError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps",
                                  "ramp_up_strategy")
    ramp = RampUp(strategy, args.ramp_up_start_rps, args.ramp_up_end_rps)
    ramp.validate(args.request_rate)
    return ramp


def serve_config(args: argparse.Namespace, model: str | None, headers: dict[str, str],
                 **overrides: Any) -> ServeConfig:
    """A :class:`ServeConfig` from parsed flags; ``model`` is the ``model`` field to send.

    Raises:
        InvalidRequestError: bad percentiles, SLOs, counts, backend/endpoint or ramp-up flags.
    """
    _check_counts(args)
    _, api = backend_api(args)
    values = dict(
        base_url=base_url(args), endpoint=args.endpoint, api=api, model=model, headers=headers,
        verify_tls=not args.insecure, burstiness=args.burstiness, num_warmups=args.num_warmups, seed=args.seed,
        duration_s=args.duration, ignore_eos=args.ignore_eos, extra_body=extra_body(args), logprobs=args.logprobs,
        request_id_prefix=args.request_id_prefix if args.request_id_prefix is not None
        else f"bench-{uuid.uuid4().hex[:8]}-",
        lora_modules=tuple(args.lora_modules or ()), lora_assignment=args.lora_assignment,
        ready_check_timeout_s=float(args.ready_check_timeout_sec), percentiles=tuple(args.metric_percentiles),
        goodput_slos_ms=parse_goodput(args.goodput), request_timeout_s=args.request_timeout,
        disable_tqdm=args.disable_tqdm,
    )
    if hasattr(args, "request_rate"):
        values.update(request_rate=args.request_rate, max_concurrency=args.max_concurrency, ramp_up=_ramp_up(args))
    values.update(overrides)
    if values.get("max_concurrency") is not None and values["max_concurrency"] < 1:
        raise InvalidRequestError(f"--max-concurrency must be >= 1, got {values['max_concurrency']}", "max_concurrency")
    return ServeConfig(**values)


def prepare_online_args(args: argparse.Namespace) -> None:
    """Refusals, then vLLM's defaults: lengths and counts, and ``ignore_eos`` for the random
    dataset (vLLM ignores EOS there so every request generates its output length).

    Raises:
        InvalidRequestError: a refused flag, backend, dataset or tokenizer mode.
    """
    check_refused(args)
    if args.dataset_name in ("random", "prefix_repetition", "shared-prefix", "copy-edit") and args.dataset_path is not None:
        raise InvalidRequestError(f"--dataset-name {args.dataset_name} generates its prompts and takes no "
                                  f"--dataset-path; name the file's format (sharegpt, custom, spec_bench, jsonl)",
                                  "dataset_path")
    apply_length_flags(args)
    if args.dataset_name == "random":
        args.ignore_eos = True
    if math.isnan(args.burstiness):
        raise InvalidRequestError("--burstiness must be a number > 0", "burstiness")


def default_result_path(kind: str) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("bench_results") / f"{kind}-{stamp}.json"


def run_bench(args: argparse.Namespace) -> int:
    """Run the parsed ``bench`` subcommand; returns the process exit code (0 ok, 1 some requests
    failed, 2 invalid arguments)."""
    from kvserve.bench import commands

    try:
        return commands.COMMANDS[args.bench_command](args)
    except InvalidRequestError as exc:
        print(f"kvserve bench: error: {exc.message}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_bench(args)
