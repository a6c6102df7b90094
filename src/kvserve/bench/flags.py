"""The flags of ``kvserve bench serve|sweep|throughput``.

``serve`` takes every flag of vLLM's ``vllm bench serve`` (``vllm/benchmarks/serve.py``
``add_cli_args`` and ``vllm/benchmarks/datasets`` ``add_dataset_parser``) with vLLM's names and
defaults, so a ``vllm bench serve`` command line runs unchanged with its first word changed. Flags
kvserve does not implement are parsed too, with ``default=SUPPRESS`` so that they appear in the
namespace only when given; :mod:`kvserve.bench.refused` then refuses them by name with the reason.
kvserve's own flags (``--duration``, ``--request-timeout``, ``--result-file``, the shared-prefix and
jsonl workloads) sit beside them.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from kvserve.bench.refused import REFUSED_FLAGS
from kvserve.cpu_threads import cpu_threads_arg

DEFAULT_NUM_PROMPTS = 1000  # vLLM's, for every dataset but kvserve's jsonl (the whole file)


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


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def add_refused_args(p: argparse.ArgumentParser) -> None:
    """vLLM flags kvserve does not implement: parsed (so the error names them), never defaulted."""
    g = p.add_argument_group("vLLM flags kvserve refuses (each is an error naming the reason)")
    for flag, (nargs, _reason) in REFUSED_FLAGS.items():
        if nargs == 0:
            g.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        else:
            g.add_argument(flag, nargs=nargs, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def add_dataset_args(p: argparse.ArgumentParser) -> None:
    """Workload flags: vLLM's dataset flags (random, sharegpt, custom, prefix_repetition,
    spec_bench) and kvserve's (shared-prefix, jsonl)."""
    g = p.add_argument_group("workload (vLLM's dataset flags)")
    g.add_argument("--dataset-name", default="random",
                   help="random, sharegpt, custom, prefix_repetition, spec_bench (vLLM's); shared-prefix, "
                        "copy-edit, jsonl (kvserve's)")
    g.add_argument("--dataset-path", help="ShareGPT JSON, custom / spec_bench / jsonl JSONL file")
    g.add_argument("--num-prompts", type=int, default=None,
                   help=f"requests (default {DEFAULT_NUM_PROMPTS}; jsonl: the whole file; <= 0 with custom or "
                        "spec_bench: the whole file)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--trust-remote-code", action="store_true", help="let the tokenizer folder run its own code")
    g.add_argument("--no-oversample", action="store_true",
                   help="file datasets: do not repeat prompts to reach --num-prompts")
    g.add_argument("--disable-shuffle", action="store_true", help="keep file datasets in file order")
    g.add_argument("--skip-chat-template", action="store_true",
                   help="custom / spec_bench: send the prompt without the tokenizer's chat template")
    g.add_argument("--input-len", type=int, default=None, help="sets --random-input-len")
    g.add_argument("--output-len", type=int, default=None,
                   help="sets every dataset's output length (--random-output-len, --sharegpt-output-len, ...)")
    g.add_argument("--random-input-len", type=int, default=1024)
    g.add_argument("--random-output-len", type=int, default=128)
    g.add_argument("--random-range-ratio", default="0.0",
                   help='a number in [0, 1) or {"input": r, "output": r}: lengths drawn from '
                        "[len * (1 - r), len * (1 + r)]")
    g.add_argument("--random-prefix-len", type=int, default=0,
                   help="random: one fixed random prefix of this many tokens before every prompt")
    g.add_argument("--sharegpt-output-len", type=int, default=None)
    g.add_argument("--custom-output-len", type=int, default=256)
    g.add_argument("--spec-bench-output-len", type=int, default=256)
    g.add_argument("--spec-bench-category", default=None)
    g.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    g.add_argument("--prefix-repetition-suffix-len", type=int, default=256)
    g.add_argument("--prefix-repetition-num-prefixes", type=int, default=10)
    g.add_argument("--prefix-repetition-output-len", type=int, default=128)
    g.add_argument("--chat-template-kwargs", type=json_object, default=None,
                   help="JSON passed to the tokenizer's chat template (custom / spec_bench)")
    k = p.add_argument_group("workload (kvserve's shared-prefix dataset)")
    k.add_argument("--num-groups", type=int, default=4, help="shared-prefix: G")
    k.add_argument("--prompts-per-group", type=int, default=8, help="shared-prefix: P")
    k.add_argument("--system-prompt-len", type=int, default=512, help="shared-prefix: S tokens")
    k.add_argument("--question-len", type=int, default=64, help="shared-prefix: Q tokens")
    c = p.add_argument_group("workload (kvserve's copy-edit dataset: repeat or lightly edit a passage)")
    c.add_argument("--copy-passage-len", type=int, default=128,
                   help="copy-edit: least passage length in tokens (whole sentences)")
    c.add_argument("--copy-kinds", default="repeat,replace,spelling,continue",
                   help="copy-edit: prompt kinds to draw from (repeat, replace, spelling, continue)")


def _add_server_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--backend", default=None,
                   help="openai or vllm (completions payload), openai-chat (chat payload); default: from "
                        "--endpoint")
    g.add_argument("--base-url", default=None, help="server root (default http://HOST:PORT)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--endpoint", default="/v1/completions")
    g.add_argument("--header", nargs="*", default=None, metavar="KEY=VALUE",
                   help="extra headers; OPENAI_API_KEY in the environment is sent as Authorization: Bearer")
    g.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    g.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    g.add_argument("--served-model-name", default=None, help="the model field sent (default: --model)")
    g.add_argument("--tokenizer", default=None,
                   help="local tokenizer folder (default: --model or the server's model root, when local)")
    g.add_argument("--tokenizer-mode", default="auto", help="auto, hf or slow")
    g.add_argument("--lora-modules", nargs="+", default=None, help="adapter names to spread requests over")
    g.add_argument("--lora-assignment", choices=("random", "round-robin"), default="random")
    g.add_argument("--request-id-prefix", default=None, help="X-Request-Id prefix (default bench-<random>-)")
    g.add_argument("--ready-check-timeout-sec", type=int, default=0,
                   help="retry the first request until it succeeds, at most this long (0 = no check)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling parameters (sent only when given)")
    for flag, kind in (("--top-p", float), ("--top-k", int), ("--min-p", float), ("--temperature", float),
                       ("--frequency-penalty", float), ("--presence-penalty", float),
                       ("--repetition-penalty", float)):
        g.add_argument(flag, type=kind, default=None)
    g.add_argument("--logprobs", type=int, default=None, help="logprobs per token to ask for")
    g.add_argument("--ignore-eos", action="store_true", help="generate exactly the output length "
                   "(always on for the random dataset, as vLLM)")
    g.add_argument("--extra-body", type=json_object, default=None, help="JSON merged into every request")


def _add_load_args(g: argparse._ArgumentGroup, sweep: bool) -> None:
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of gaps; 1 = Poisson, inf = regular")
    g.add_argument("--num-warmups", type=int, default=0)
    g.add_argument("--duration", type=float, default=None, help="kvserve: seconds to keep sending, cycling prompts")
    g.add_argument("--request-timeout", type=float, default=600.0, help="kvserve: per-request timeout, seconds")
    g.add_argument("--disable-tqdm", action="store_true")
    g.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    g.add_argument("--percentile-metrics", default=None,
                   help="ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue (default ttft,tpot,itl)")
    g.add_argument("--metric-percentiles", "--percentiles", dest="metric_percentiles", type=_float_list,
                   default=[99.0], help="comma-separated percentiles (default 99)")
    if sweep:
        g.add_argument("--concurrency", type=_int_list, default=[], help="e.g. 1,8,32")
        g.add_argument("--request-rates", type=_float_list, default=[], help="e.g. 1,4,inf")
        return
    g.add_argument("--request-rate", type=float, default=math.inf, help="requests/s; inf = all at once")
    g.add_argument("--max-concurrency", type=int, default=None)
    g.add_argument("--ramp-up-strategy", choices=("linear", "exponential"), default=None)
    g.add_argument("--ramp-up-start-rps", type=int, default=None)
    g.add_argument("--ramp-up-end-rps", type=int, default=None)


def _add_result_args(p: argparse.ArgumentParser, sweep: bool) -> None:
    g = p.add_argument_group("results")
    if sweep:
        g.add_argument("--result-file", default=None, help="JSON (default bench_results/sweep-TIME.json)")
        g.add_argument("--plot-file", default=None, help="PNG (default: the result file with .png)")
        return
    g.add_argument("--result-file", default=None, help="kvserve: write the result JSON to this path")
    g.add_argument("--save-result", action="store_true", help="write the result JSON (vLLM's file name)")
    g.add_argument("--save-detailed", action="store_true",
                   help="keep per-request lists (input_lens, ttfts, itls, generated_texts, errors, ...)")
    g.add_argument("--append-result", action="store_true", help="append the result as one JSON line")
    g.add_argument("--result-dir", default=None)
    g.add_argument("--result-filename", default=None)
    g.add_argument("--label", default=None, help="file name prefix (default: the backend)")
    g.add_argument("--metadata", nargs="*", default=None, metavar="KEY=VALUE", help="extra keys in the result")


def add_roofline_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-roofline", action="store_true",
                   help="kvserve: skip the machine probe (a few seconds) and the roofline fraction of the run")


def add_online_args(p: argparse.ArgumentParser, sweep: bool) -> None:
    """Server, sampling, load and result flags of ``serve`` (``sweep``: load lists instead)."""
    server = p.add_argument_group("server")
    _add_server_args(server)
    _add_sampling_args(p)
    _add_load_args(p.add_argument_group("load"), sweep)
    _add_result_args(p, sweep)
    add_roofline_arg(p)


def add_throughput_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=None, help="local model folder (default: the built-in model)")
    g.add_argument("--tokenizer", default=None, help="tokenizer folder (default: --model)")
    g.add_argument("--engine-kwargs", type=json_object, default={}, help='JSON, e.g. {"max_num_seqs": 32}')
    g.add_argument("--cpu-threads", type=cpu_threads_arg, default="auto", metavar="N|auto",
                   help="CPU threads of the in-process engine, set as `kvserve serve --cpu-threads` sets them "
                        "(before torch loads, with OpenMP's passive waiting; default auto)")
    g.add_argument("--result-file", default=None, help="write the result JSON here")
    g.add_argument("--ignore-eos", action="store_true", help="generate exactly the output length")
    g.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of every request (default 1.0 with top_p 1.0, as vLLM's bench "
                        "throughput samples; 0 = greedy)")
    add_roofline_arg(p)
