"""One MXFP4 expert's projections (GPT-OSS-20B: gate-up [5760, 2880], down [2880, 2880]) with
bfloat16 activations on the quantized GEMM's vector instruction sets, in one process: the avx512
library (instruction set 3, AVX-512F FMAs) and the avx512_bf16 one (4, AVX512-BF16 pairs, where
the CPU has it), each variant's library opened side by side (``kvserve.kernels.kernels_for_variant``,
built on first use), AMX off. Each cell is the best of 5 passes over 8 weight copies (about 80 MB:
past the last-level cache, as a decode step streams its experts).

    python benchmarks/bench_quant_isa.py
    python benchmarks/bench_quant_isa.py --amx    # the AMX tile kernel instead (where the CPU has it)

``--amx`` times the layer as the engine runs it on an AMX host (tiles from 2 rows, the one-row
vector kernel at 1); to compare two builds of the kernels, run it at each commit, alternating.
"""

from __future__ import annotations

import argparse
import time

import torch

from kvserve.kernels import build, cpu_kernels, kernels_for_variant
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.quant_tensor import quantize_mxfp4

SHAPES = {"gate_up": (5760, 2880), "down": (2880, 2880)}
ROWS = (1, 2, 4, 8, 16, 32, 64)


def best_ms(layers: list[QuantizedLinear], x: torch.Tensor, passes: int = 5) -> float:
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        for layer in layers:
            layer(x)
        best = min(best, (time.perf_counter() - start) / len(layers))
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--amx", action="store_true", help="time the AMX tile kernel")
    amx = parser.parse_args().amx
    runnable = [variant.name for variant in build.host_variants()]
    paths = ["amx"] if amx else [name for name in ("avx512", "avx512_bf16") if name in runnable]
    kernels = {name: cpu_kernels() if name == "amx" else kernels_for_variant(name) for name in paths}
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        weights = [quantize_mxfp4(torch.randn(n, k) * 0.02) for _ in range(8)]
        layers = {path: [QuantizedLinear(w, None, kernels[path], **({} if amx else dict(amx=False))) for w in weights]
                  for path in paths}
        if amx and not layers["amx"][0].amx:
            raise SystemExit("--amx: this CPU (or process) has no AMX tiles")
        for rows in ROWS:
            x = torch.randn(rows, k).to(torch.bfloat16)
            times = {path: best_ms(layers[path], x) for path in paths}
            cells = "  ".join(f"{path} {ms:.3f} ms" for path, ms in times.items())
            ratio = f"  ratio {times['avx512'] / times['avx512_bf16']:.2f}x" if len(times) == 2 else ""
            print(f"{name} {rows:3d} rows: {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
