"""``kvserve bench {serve,sweep,throughput}``: argument parsing and the three commands.

Flag names follow vLLM's ``vllm bench`` where one exists (``--request-rate``, ``--burstiness``,
``--max-concurrency``, ``--goodput``, ``--percentile-metrics`` aside).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kvserve.bench.client import ENDPOINTS
from kvserve.bench.datasets import DATASETS, SampleRequest, get_dataset
from kvserve.bench.metrics import parse_goodput
from kvserve.bench.runner import ServeConfig
from kvserve.errors import InvalidRequestError


def _float_list(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--dataset-name", default="random", choices=sorted(DATASETS))
    g.add_argument("--dataset-path", help="ShareGPT JSON or JSONL file")
    g.add_argument("--num-prompts", type=int, default=None, help="requests (default: the dataset's own size)")
    g.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=1024)
    g.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=128)
    g.add_argument("--random-range-ratio", type=float, default=0.0)
    g.add_argument("--num-groups", type=int, default=4, help="shared-prefix: G")
    g.add_argument("--prompts-per-group", type=int, default=8, help="shared-prefix: P")
    g.add_argument("--system-prompt-len", type=int, default=512, help="shared-prefix: S tokens")
    g.add_argument("--question-len", type=int, default=64, help="shared-prefix: Q tokens")
    g.add_argument("--sharegpt-output-len", type=int, default=None)
    g.add_argument("--ignore-eos", action="store_true", help="generate exactly the output length")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)


def _add_online_args(p: argparse.ArgumentParser, sweep: bool) -> None:
    g = p.add_argument_group("server and load")
    g.add_argument("--base-url", default="http://127.0.0.1:8000")
    g.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    g.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    g.add_argument("--tokenizer", default=None,
                   help="local tokenizer folder of the served model (default: the built-in model's, "
                        "when the server serves kvserve's built-in model)")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of gaps; 1 = Poisson")
    g.add_argument("--num-warmups", type=int, default=0)
    g.add_argument("--duration", type=float, default=None, help="seconds to keep sending (instead of --num-prompts)")
    g.add_argument("--percentiles", type=_float_list, default=[50.0, 90.0, 99.0])
    g.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    g.add_argument("--extra-body", type=_json_object, default={}, help="JSON merged into every request")
    g.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    g.add_argument("--disable-tqdm", action="store_true")
    if sweep:
        g.add_argument("--concurrency", type=_int_list, default=[], help="e.g. 1,8,32")
        g.add_argument("--request-rates", type=_float_list, default=[], help="e.g. 1,4,inf")
        g.add_argument("--result-file", default=None, help="JSON (default bench_results/sweep-TIME.json)")
        g.add_argument("--plot-file", default=None, help="PNG (default: the result file with .png)")
    else:
        g.add_argument("--request-rate", type=float, default=math.inf, help="requests/s; inf = all at once")
        g.add_argument("--max-concurrency", type=int, default=None)
        g.add_argument("--result-file", default=None, help="write the result JSON here")


def _add_throughput_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", required=True, help="local model folder")
    g.add_argument("--tokenizer", default=None, help="tokenizer folder (default: --model)")
    g.add_argument("--engine-kwargs", type=_json_object, default={}, help='JSON, e.g. {"max_num_seqs": 32}')
    g.add_argument("--result-file", default=None, help="write the result JSON here")


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``bench`` with ``serve``, ``sweep`` and ``throughput`` to an ``add_subparsers()`` object;
    the parsed namespace's ``bench_command`` names the subcommand. Run it with :func:`run_bench`."""
    bench = subparsers.add_parser("bench", help="benchmark a server (serve, sweep) or the engine (throughput)")
    sub = bench.add_subparsers(dest="bench_command", required=True)
    for name, help_text in (("serve", "one online run against an OpenAI-compatible server"),
                            ("sweep", "online runs over several concurrencies / request rates"),
                            ("throughput", "offline: the in-process engine, all prompts at once")):
        p = sub.add_parser(name, help=help_text)
        if name == "throughput":
            _add_throughput_args(p)
        else:
            _add_online_args(p, sweep=name == "sweep")
        _add_dataset_args(p)
    return bench


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser of ``python -m kvserve.bench``."""
    parser = argparse.ArgumentParser(prog="kvserve")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    return parser


FILE_DATASETS = ("jsonl", "sharegpt")
SWEEP_SEED_STRIDE = 100  # point i of a sweep draws its prompts with seed --seed + 100 * i


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
    generated workloads (random, shared-prefix) do not warm the server's prefix cache for the
    measured prompts. File workloads give their prompts in file order, so there the first
    measured prompts are reused (their prefixes may be cached). None when no warmups."""
    if args.num_warmups <= 0:
        return None
    dataset = get_dataset(args)
    rng = np.random.default_rng(args.seed + 1)
    if args.dataset_name in FILE_DATASETS:
        return dataset.sample(tokenizer, None, rng)[: args.num_warmups]
    return dataset.sample(tokenizer, args.num_warmups, rng)


def serve_config(args: argparse.Namespace, **overrides: Any) -> ServeConfig:
    """A :class:`ServeConfig` from parsed flags.

    Raises:
        InvalidRequestError: bad percentiles, SLOs or counts.
    """
    if any(not 0 <= p <= 100 for p in args.percentiles):
        raise InvalidRequestError(f"percentiles must be in [0, 100], got {args.percentiles}", "percentiles")
    if args.num_warmups < 0:
        raise InvalidRequestError(f"--num-warmups must be >= 0, got {args.num_warmups}", "num_warmups")
    if args.duration is not None and not args.duration > 0:
        raise InvalidRequestError(f"--duration must be > 0 seconds, got {args.duration}", "duration")
    values = dict(
        base_url=args.base_url.rstrip("/"), endpoint=args.endpoint, model=args.model,
        burstiness=args.burstiness, num_warmups=args.num_warmups, seed=args.seed, duration_s=args.duration,
        ignore_eos=args.ignore_eos, temperature=args.temperature, extra_body=args.extra_body,
        percentiles=tuple(args.percentiles), goodput_slos_ms=parse_goodput(args.goodput),
        request_timeout_s=args.request_timeout, disable_tqdm=args.disable_tqdm,
    )
    values.update(overrides)
    if values.get("max_concurrency") is not None and values["max_concurrency"] < 1:
        raise InvalidRequestError(f"--max-concurrency must be >= 1, got {values['max_concurrency']}", "max_concurrency")
    return ServeConfig(**values)


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
