"""The ``kvserve`` command: ``serve``, ``route``, ``generate``, ``chat`` and ``bench``."""

from __future__ import annotations

import argparse
import atexit
import logging
import sys
import time

from kvserve import __version__
from kvserve.engine.arg_types import positive_int
from kvserve.engine.arg_utils import add_engine_args, engine_config_from_args
from kvserve.errors import KVServeError
from kvserve.process_exit import exit_now

logger = logging.getLogger("kvserve")


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``kvserve serve: error: argument --quantization/-q: ...``)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="Hugging Face model folder (or --model); default: the built-in model")


def _add_log_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvserve", description="kvserve: an LLM serving engine on PyTorch")
    parser.add_argument("--version", action="version", version=f"kvserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server",
                           description="Serve a model over the OpenAI API. Flags follow `vllm serve` and its "
                                       "groups; vLLM flags kvserve does not implement are refused by name "
                                       "(docs/vllm_compat.md lists them).")
    _model_arg(serve)
    add_engine_args(serve)
    from kvserve.api.server_args import add_server_args

    add_server_args(serve)
    _add_log_args(serve)
    from kvserve.metrics.wiring import add_observability_args

    add_observability_args(serve)  # --log-stats-interval, --enable-log-requests, --log-format, ...

    route = sub.add_parser("route", help="route OpenAI requests over workers (cache- and load-aware)",
                           description="A gateway over kvserve (or vLLM, SGLang, llama.cpp) workers: cache-aware "
                                       "routing from KV events, health checks, retries, drain, a scaling signal "
                                       "(docs/router.md).")
    from kvserve.router.config import add_router_args

    add_router_args(route)
    _add_log_args(route)

    gen = sub.add_parser("generate", help="generate text for a prompt in this process")
    _model_arg(gen)
    gen.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    gen.add_argument("--max-tokens", type=positive_int, default=32, help="tokens to generate (default 32)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    add_engine_args(gen)
    _add_log_args(gen)

    chat = sub.add_parser("chat", help="chat in the terminal, in this process or with a running server")
    _model_arg(chat)
    chat.add_argument("--base-url", default=None, help="a running server's URL, e.g. http://127.0.0.1:8000/v1")
    chat.add_argument("--api-key", default=None, help="the server's API key (default: $KVSERVE_API_KEY)")
    chat.add_argument("--max-tokens", type=positive_int, default=128, help="reply length cap (default 128)")
    chat.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    add_engine_args(chat)
    _add_log_args(chat)

    from kvserve.bench.cli import add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a ``kvserve`` command. A user's mistake (bad model folder, flag, prompt) ends with a
    one-line ``kvserve: error: ...`` and exit status 2; ``--log-level debug`` adds the traceback."""
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore"):  # one INFO line per HTTP request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if hasattr(args, "cpu_threads") and not getattr(args, "base_url", None):
            from kvserve.cpu_threads import apply_cpu_threads

            apply_cpu_threads(args.cpu_threads)  # before torch is imported: see kvserve.cpu_threads
        return _run(args, list(sys.argv[1:] if argv is None else argv))
    except (KVServeError, ValueError, OSError, ImportError) as exc:
        if level == "DEBUG":
            raise
        print(f"kvserve: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _one_line(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    if message is None and isinstance(exc, OSError) and exc.strerror and exc.filename is None:
        message = exc.strerror  # no "[Errno 98]" prefix on our own socket messages
    return " ".join(str(message or exc).split())


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.command == "serve" and args.data_parallel_size > 1:
        from kvserve.router.launcher import run_data_parallel

        if args.tensor_parallel_size > 1:
            raise ValueError("--data-parallel-size with --tensor-parallel-size > 1 is not supported yet")
        if args.kv_role or args.kv_transfer_config:
            raise ValueError("--kv-role and --kv-transfer-config serve one engine: start one kvserve serve per "
                             "prefill or decode instance instead of --data-parallel-size (docs/kv_tiers.md)")

        return run_data_parallel(args, argv[argv.index("serve") + 1:])
    if args.command == "serve":
        from kvserve.start_progress import StartProgress

        progress = StartProgress("starting the server")  # before the imports: they take seconds
        try:
            from kvserve.api.launcher import run_server

            return run_server(args, progress)
        finally:
            progress.stop()
    if args.command == "route":
        from kvserve.router.launcher import run_route

        return run_route(args)
    if args.command == "generate":
        return _generate(args)
    if args.command == "chat":
        from kvserve.chat import run_chat

        return run_chat(args)
    from kvserve.bench.cli import run_bench

    return run_bench(args)


def _generate(args: argparse.Namespace) -> int:
    from kvserve.engine.llm import LLM
    from kvserve.sampling_params import SamplingParams

    from kvserve.builtin import resolve_model
    from kvserve.engine.arg_utils import model_from_args

    model, _ = resolve_model(model_from_args(args))
    llm = LLM.from_config(engine_config_from_args(model, args))
    start = time.perf_counter()
    outputs = llm.generate(args.prompt, SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens), use_tqdm=False)
    elapsed = time.perf_counter() - start
    num_tokens = 0
    for out in outputs:
        choice = out.outputs[0]
        num_tokens += len(choice.token_ids)
        print(f"{out.prompt}{choice.text}")
        print(f"  [{len(choice.token_ids)} tokens, finish_reason={choice.finish_reason}]")
    print(f"{num_tokens} tokens in {elapsed:.2f} s ({num_tokens / elapsed:.1f} tokens/s)", file=sys.stderr)
    return 0


def entry_point() -> None:
    """The ``kvserve`` program: :func:`main`, then the exit without the interpreter's module
    teardown (``kvserve.process_exit``: 2-4 s after every command on a 2-core host). Non-daemon
    threads are joined and the other exit handlers run first: this one is registered before any
    of theirs, and exit handlers run last-registered first."""
    status = [1]  # an exception escaping main exits 1, after its traceback
    atexit.register(lambda: exit_now(status[0]))
    try:
        status[0] = main()
    except SystemExit as exc:  # argparse's --help and usage errors
        status[0] = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        raise
    sys.exit(status[0])


if __name__ == "__main__":
    entry_point()
