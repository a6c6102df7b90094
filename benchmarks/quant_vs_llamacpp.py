"""kvserve's int8 / int4 weights against llama.cpp's Q8_0 / Q4_0 of the same source weights, at
batch 1 (issue 15's targets: kvserve int8 TPOT at most llama.cpp Q8_0's, int4 at most 1.1x Q4_0's).

One process runs, one after another and on the same workload (``kvserve bench serve``, random
128-token prompts, 128 output tokens, concurrency 1): ``kvserve serve`` with ``--quantization
int8`` and ``int4`` (each with and without ``--quantize-lm-head``) and bfloat16, then
``baseline_llamacpp.py`` with the checkpoint exported to GGUF (bf16) and quantized by llama.cpp's
own quantizer to Q8_0 and Q4_0 (llama.cpp keeps the output tensor of a Q4_0 file at Q6_K, as
``llama-quantize`` does). Prints one line per system and writes every result file to
``--result-dir``::

    python benchmarks/quant_vs_llamacpp.py --model /tmp/qwen-shaped --result-dir bench_results/quant_llamacpp
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from servers import bench_serve, kvserve_server

HERE = Path(__file__).resolve().parent
KVSERVE_FORMATS = {
    "kvserve bf16": [],
    "kvserve int8": ["--quantization", "int8"],
    "kvserve int8+lm_head": ["--quantization", "int8", "--quantize-lm-head"],
    "kvserve int4": ["--quantization", "int4"],
    "kvserve int4+lm_head": ["--quantization", "int4", "--quantize-lm-head"],
}
LLAMACPP_TYPES = ("Q8_0", "Q4_0", None)  # None: the bf16 GGUF


def tpot_line(name: str, doc: dict) -> str:
    m = doc["metrics"]
    return (f"{name:24s} TPOT median {m['tpot_ms']['median']:7.2f} ms  mean {m['tpot_ms']['mean']:7.2f} ms  "
            f"TTFT median {m['ttft_ms']['median']:7.1f} ms  output {m['output_throughput']:6.1f} tok/s")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="/tmp/qwen-shaped")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--result-dir", default="bench_results/quant_llamacpp")
    p.add_argument("--llamacpp-python", default="/tmp/llamacpp-venv/bin/python")
    args = p.parse_args(argv)
    out = Path(args.result_dir)
    out.mkdir(parents=True, exist_ok=True)
    workload = ["--dataset-name", "random", "--input-len", "128", "--output-len", "128",
                "--num-prompts", str(args.num_prompts), "--seed", "0"]
    lines = []
    for name, extra in KVSERVE_FORMATS.items():
        slug = name.split()[1].replace("+", "_")
        with kvserve_server(args.model, out / f"kvserve-{slug}.log", extra=extra) as url:
            doc = bench_serve(url, args.model, out / f"kvserve-{slug}-c1.json", workload, 1, num_warmups=1)
        lines.append(tpot_line(name, doc))
        print(lines[-1], flush=True)
    for quantize in LLAMACPP_TYPES:
        command = [sys.executable, str(HERE / "baseline_llamacpp.py"), "--model", args.model, "--concurrency", "1",
                   "--num-prompts", str(args.num_prompts), "--result-dir", str(out),
                   "--llamacpp-python", args.llamacpp_python]
        if quantize:
            command += ["--quantize", quantize]
        subprocess.run(command, check=True)
        suffix = f"-{quantize.lower()}" if quantize else ""
        doc = json.loads((out / f"llamacpp{suffix}-c1.json").read_text())
        lines.append(tpot_line(f"llama.cpp {quantize or 'bf16'}", doc))
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
