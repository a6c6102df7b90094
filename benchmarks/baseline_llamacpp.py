"""Baseline: llama.cpp (llama-cpp-python's OpenAI-compatible server) under ``kvserve bench serve``.

    python benchmarks/baseline_llamacpp.py --model /tmp/qwen-shaped --concurrency 1,8 \
        --num-prompts 4 --result-dir bench_results/llamacpp

llama-cpp-python lives in its own venv so the project's stays clean (build it once, ~5 min)::

    python3 -m venv /tmp/llamacpp-venv
    /tmp/llamacpp-venv/bin/pip install "llama-cpp-python[server]==0.3.36" gguf numpy

Steps: convert the checkpoint to GGUF with ``gguf_export.py`` in this Python (bf16 by default; skipped when the
file exists), with ``--quantize Q8_0|Q4_0|...`` quantize that file with llama.cpp's own quantizer
(``llama_model_quantize``, as ``llama-quantize`` does; made once beside it), start ``python -m llama_cpp.server`` from that venv with ``--n_threads`` threads,
then run the same ``kvserve bench serve`` workload as kvserve at each ``--concurrency``.
llama-cpp-python's server runs one completion at a time (its ``Llama`` object has one sequence),
so requests above 1 queue inside the server: TTFT grows, throughput stays the batch-1 rate.
The server is started with ``--interrupt_requests False``: by default a new request cancels the
one being generated (at concurrency 8 seven of eight requests were cut off that way).

llama-cpp-python has no ``ignore_eos``; end-of-generation ids get a -100 ``logit_bias`` instead,
so every request generates exactly ``--output-len`` tokens. Its streams carry no ``usage``, so the
bench tool can only count output tokens by re-encoding the text, which undercounts (re-encoding
merges tokens). So after the run one non-streamed request with the same settings checks that
``usage.completion_tokens == --output-len``; when it does, every request's count is set to
``--output-len`` and throughput and TPOT are recomputed (the tokenizer-counted figures are kept
under ``metrics_tokenizer_counted``). Each result file is the bench tool's (with its provenance)
plus a ``baseline`` block: llama-cpp-python and gguf versions, the GGUF file, the server command,
the probe's usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import httpx
from servers import bench_serve, free_port, running_server

from kvserve.bench.metrics import latency_stats

HERE = Path(__file__).resolve().parent
DEFAULT_PYTHON = "/tmp/llamacpp-venv/bin/python"


def llamacpp_versions(python: str) -> dict[str, str]:
    """Versions of llama-cpp-python and gguf in the llama.cpp venv.

    Raises:
        FileNotFoundError / subprocess.CalledProcessError: the venv or its packages are missing.
    """
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({p: m.version(p) for p in ('llama_cpp_python', 'gguf', 'numpy')}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def ensure_gguf(python: str, model: str, gguf: Path, outtype: str) -> Path:
    """``gguf`` converted from ``model`` unless it exists (the exporter runs in this Python, which has
    kvserve, numpy and gguf; ``python``, llama.cpp's venv, is not needed for it)."""
    if not gguf.exists():
        print(f"converting {model} -> {gguf} ({outtype})", flush=True)
        subprocess.run([sys.executable, str(HERE / "gguf_export.py"), model, str(gguf), "--outtype", outtype],
                       check=True)
    return gguf


# llama.cpp's own quantizer (llama_model_quantize), run from the llama.cpp venv on the exported
# GGUF: the file a llama.cpp user makes with `llama-quantize model.gguf out.gguf Q8_0`.
QUANTIZE_SCRIPT = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.nthread = 2
status = llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params)
sys.exit(status)
"""


def ensure_quantized(python: str, source: Path, quantize: str) -> Path:
    """``source`` quantized by llama.cpp to ``quantize`` (Q8_0, Q4_0, ...), beside it; made once."""
    out = source.with_name(f"{source.stem}-{quantize.lower()}.gguf")
    if not out.exists():
        print(f"quantizing {source} -> {out} ({quantize}, llama.cpp's quantizer)", flush=True)
        subprocess.run([python, "-c", QUANTIZE_SCRIPT, str(source), str(out), quantize.upper()], check=True)
    return out


def server_command(python: str, gguf: Path, port: int, n_threads: int, n_ctx: int) -> list[str]:
    return [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(n_ctx), "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads),
            "--model_alias", "qwen-shaped", "--interrupt_requests", "False"]


def eog_logit_bias(model: str) -> dict[str, float]:
    """``{id: -100}`` for the tokenizer's end-of-generation ids (eos and ``<|im_end|>``)."""
    from kvserve.bench.prompts import load_tokenizer

    tokenizer = load_tokenizer(model)
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} - {None}
    return {str(i): -100.0 for i in sorted(ids)}


def probe_completion_tokens(base_url: str, prompt: str, output_len: int, logit_bias: dict) -> dict:
    """``usage`` of one non-streamed completion with the benchmark's settings."""
    body = {"model": "qwen-shaped", "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
            "logit_bias": logit_bias}
    response = httpx.post(base_url + "/v1/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()["usage"]


def correct_output_counts(doc: dict, output_len: int) -> None:
    """Set every completed request's output count to ``output_len`` and recompute the figures
    that depend on it (output/total throughput, TPOT), keeping the old ``metrics``."""
    m = doc["metrics"]
    doc["metrics_tokenizer_counted"] = json.loads(json.dumps(m))
    done = [r for r in doc["requests"] if r["success"]]
    for r in done:
        r["output_tokens"], r["output_tokens_source"] = output_len, "probe-verified max_tokens"
    m["total_output_tokens"] = output_len * len(done)
    m["output_throughput"] = m["total_output_tokens"] / m["duration_s"]
    m["total_token_throughput"] = (m["total_input_tokens"] + m["total_output_tokens"]) / m["duration_s"]
    percentiles = [float(p) for p in m["tpot_ms"]["percentiles"]]
    tpots = [(r["e2el_s"] - r["ttft_s"]) / (output_len - 1) for r in done] if output_len > 1 else []
    m["tpot_ms"] = dataclasses.asdict(latency_stats(tpots, percentiles))
    m["output_tokens_from_tokenizer"] = 0


def run(args: argparse.Namespace) -> list[Path]:
    versions = llamacpp_versions(args.llamacpp_python)
    gguf = ensure_gguf(args.llamacpp_python, args.model, Path(args.gguf or f"{args.model}/model-{args.outtype}.gguf"),
                       args.outtype)
    if args.quantize:
        gguf = ensure_quantized(args.llamacpp_python, gguf, args.quantize)
    port = free_port()
    command = server_command(args.llamacpp_python, gguf, port, args.n_threads, args.n_ctx)
    workload = ["--dataset-name", "random", "--input-len", str(args.input_len), "--output-len",
                str(args.output_len), "--num-prompts", str(args.num_prompts), "--seed", str(args.seed)]
    logit_bias = eog_logit_bias(args.model)
    # No x-request-id header: llama-cpp-python's server (starlette-context) answers HTTP 400 with an
    # empty body to a request id that is not a UUID.
    extra = ["--extra-body", json.dumps({"logit_bias": logit_bias}), "--request-id-prefix", ""]
    result_dir = Path(args.result_dir)
    written = []
    with running_server(command, f"http://127.0.0.1:{port}/v1/models", result_dir / "llamacpp-server.log"):
        for concurrency in args.concurrency:
            suffix = f"-{args.quantize.lower()}" if args.quantize else ""
            path = result_dir / f"llamacpp{suffix}-c{concurrency}.json"
            doc = bench_serve(f"http://127.0.0.1:{port}", args.model, path, workload, concurrency,
                              num_warmups=args.num_warmups, extra=extra)
            usage = probe_completion_tokens(f"http://127.0.0.1:{port}", "probe " * 8, args.output_len, logit_bias)
            if usage["completion_tokens"] == args.output_len and doc["metrics"]["output_tokens_from_tokenizer"]:
                correct_output_counts(doc, args.output_len)
            doc["baseline"] = {"name": "llama.cpp", "versions": versions, "gguf": str(gguf),
                               "outtype": args.outtype, "quantize": args.quantize, "server_command": command,
                               "probe_usage": usage}
            path.write_text(json.dumps(doc, indent=2) + "\n")
            written.append(path)
    return written


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="llama.cpp baseline through llama-cpp-python's server")
    p.add_argument("--model", required=True, help="Hugging Face model folder (tokenizer and weights)")
    p.add_argument("--gguf", default=None, help="GGUF path (default MODEL/model-OUTTYPE.gguf, made if missing)")
    p.add_argument("--outtype", choices=("bf16", "f16", "f32"), default="bf16")
    p.add_argument("--quantize", choices=("Q8_0", "Q4_0", "Q4_K_M", "Q6_K"), default=None,
                   help="serve the exported GGUF quantized by llama.cpp's own quantizer to this type")
    p.add_argument("--llamacpp-python", default=DEFAULT_PYTHON, help="python of the llama.cpp venv")
    p.add_argument("--n-threads", type=int, default=2)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--num-warmups", type=int, default=1)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="workload seed, as kvserve bench --seed")
    p.add_argument("--result-dir", default="bench_results/llamacpp")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(args.llamacpp_python).exists():
        print(f"llama.cpp baseline skipped: {args.llamacpp_python} not found (see this script's docstring)")
        return 2
    for path in run(args):
        print(f"result written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
