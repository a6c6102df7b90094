"""One MXFP4 expert's projections (GPT-OSS-20B: gate-up [5760, 2880], down [2880, 2880]) with
bfloat16 activations on the quantized GEMM's vector instruction sets, in one process: 3 (AVX-512F
FMAs) and 4 (AVX512-BF16 pairs, where the CPU has it), AMX off. Each cell is the best of 5
passes over 8 weight copies (about 80 MB: past the last-level cache, as a decode step streams
its experts).

    python benchmarks/bench_quant_isa.py
    python benchmarks/bench_quant_isa.py --amx    # the AMX tile kernel instead (where the CPU has it)

``--amx`` times the layer as the engine runs it on an AMX host (tiles from 2 rows, the one-row
vector kernel at 1); to compare two builds of the kernels, run it at each commit, alternating.
"""

from __future__ import annotations

import argparse
import time

import torch

from kvserve.kernels import cpu_kernels
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
    kernels = cpu_kernels()
    isas = ["amx"] if amx else [isa for isa in (3, 4) if isa <= kernels.quant_linear_isa()]
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        weights = [quantize_mxfp4(torch.randn(n, k) * 0.02) for _ in range(8)]
        layers = {isa: [QuantizedLinear(w, None, kernels, **({} if amx else dict(isa=isa, amx=False))) for w in weights]
                  for isa in isas}
        if amx and not layers["amx"][0].amx:
            raise SystemExit("--amx: this CPU (or process) has no AMX tiles")
        for rows in ROWS:
            x = torch.randn(rows, k).to(torch.bfloat16)
            times = {isa: best_ms(layers[isa], x) for isa in isas}
            cells = "  ".join(f"{isa if amx else f'isa {isa}'} {ms:.3f} ms" for isa, ms in times.items())
            ratio = f"  ratio {times[3] / times[4]:.2f}x" if len(times) == 2 and not amx else ""
            print(f"{name} {rows:3d} rows: {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
