"""kvserve's batch-invariant CPU linear (``InvariantLinear``, ``kernels/csrc/linear.cpp``) against
what torch runs for ``F.linear`` on this machine: MKL's sgemm for float32 and torch's bfloat16
path (oneDNN where the CPU has AVX512-BF16/AMX, a slower fallback elsewhere).

Shapes are Qwen2.5-0.5B's linears (``qkv`` 896->1152, ``o`` 896->896, ``gate_up`` 896->9728,
``down`` 4864->896, ``lm_head`` 896->151936); M is the number of rows (tokens) per call. The
candidates of one (shape, M, threads) cell are timed in turns, ``--rounds`` times, each turn the
fastest of a few calls, and the best turn is kept: the machines here are shared, so the ratios of
one cell (measured minutes apart at most) are what to read, not absolute times.

Weights are cold by default, as in a decode step that streams every layer once: each call uses
the next of enough weight copies to overflow the last-level cache (``--hot`` reuses one copy).

    python benchmarks/bench_linear.py                       # the table of docs/benchmarks.md section 3.3
    python benchmarks/bench_linear.py --shape down --m 1 --m 64 --threads 1
    python benchmarks/bench_linear.py --mlp                 # MLP at 2,048 rows: 512-row tiles or not
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from timing import time_calls
from torch import nn

from kvserve.kernels import cpu_kernels
from kvserve.model.invariant_linear import InvariantLinear

SHAPES = {"qkv": (896, 1152), "o": (896, 896), "gate_up": (896, 9728), "down": (4864, 896), "lm_head": (896, 151936)}
ROWS = (1, 4, 16, 64, 256, 2048)
COLD_BYTES = 256 * 2**20  # weights touched per round of copies: well past a 32 MB L3


@dataclass(frozen=True)
class Cell:
    """Best seconds per call of each candidate at one (shape, rows, threads)."""

    shape: str
    rows: int
    threads: int
    mkl_fp32: float
    ours_fp32: float
    ours_bf16: float
    torch_bf16: float | None  # None: skipped (see --torch-bf16-max-flop)


class Rotating:
    """Calls ``fn(weight)`` with the next of ``weights`` each time."""

    def __init__(self, fn, weights):
        self.fn, self.weights = fn, itertools.cycle(weights)

    def __call__(self):
        return self.fn(next(self.weights))


def copies(weight_bytes: int, hot: bool) -> int:
    return 1 if hot else max(1, math.ceil(COLD_BYTES / weight_bytes))


def candidates(k: int, n: int, rows: int, hot: bool, torch_bf16: bool) -> dict:
    """name -> zero-argument callable for one cell."""
    kernels = cpu_kernels()
    gen = torch.Generator().manual_seed(0)
    x32 = torch.randn(rows, k, generator=gen)
    x16 = x32.to(torch.bfloat16)
    count32, count16 = copies(4 * n * k, hot), copies(2 * n * k, hot)
    w32 = [torch.randn(n, k, generator=gen) * 0.05 for _ in range(count32)]
    w16 = [torch.randn(n, k, generator=gen).mul_(0.05).to(torch.bfloat16) for _ in range(count16)]

    def packed(weight):
        linear = nn.Linear(k, n, bias=False, dtype=weight.dtype)
        linear.weight = nn.Parameter(weight, requires_grad=False)
        return InvariantLinear(linear, kernels)

    fns = {
        "mkl_fp32": Rotating(lambda w: F.linear(x32, w), w32),
        "ours_fp32": Rotating(lambda layer: layer(x32), [packed(w) for w in w32]),
        "ours_bf16": Rotating(lambda layer: layer(x16), [packed(w) for w in w16]),
    }
    if torch_bf16:
        fns["torch_bf16"] = Rotating(lambda w: F.linear(x16, w), w16)
    return fns


def measure_cell(shape: str, rows: int, threads: int, args) -> Cell:
    k, n = SHAPES[shape]
    torch.set_num_threads(threads)
    flop = 2 * rows * k * n
    fns = candidates(k, n, rows, args.hot, flop <= args.torch_bf16_max_flop)
    calls = max(1, min(20, int(2e9 / flop)))
    best = {name: math.inf for name in fns}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, fn in fns.items():
                best[name] = min(best[name], min(time_calls(fn, calls)))
    return Cell(shape, rows, threads, best["mkl_fp32"], best["ours_fp32"], best["ours_bf16"], best.get("torch_bf16"))


def format_row(cell: Cell) -> str:
    k, n = SHAPES[cell.shape]
    ms = lambda s: f"{s * 1e3:.3f}"  # noqa: E731
    gflops = 2 * cell.rows * k * n / cell.ours_bf16 / 1e9
    torch_bf16 = "skipped" if cell.torch_bf16 is None else f"{ms(cell.torch_bf16)} ({cell.torch_bf16 / cell.ours_bf16:.2f}x)"
    return (f"| {cell.shape} {k}->{n} | {cell.rows} | {cell.threads} | {ms(cell.mkl_fp32)} | "
            f"{ms(cell.ours_fp32)} ({cell.mkl_fp32 / cell.ours_fp32:.2f}x) | "
            f"{ms(cell.ours_bf16)} ({cell.mkl_fp32 / cell.ours_bf16:.2f}x) | {torch_bf16} | {gflops:.1f} |")


def header() -> str:
    try:
        git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True,  # noqa: E731
                                        cwd=Path(__file__).parent, check=False).stdout.strip()
        commit = git("rev-parse", "--short", "HEAD")
        if git("status", "--porcelain", "--", "../src/kvserve/kernels", "../src/kvserve/model"):
            commit += " (kernels/model dirty)"
    except OSError:
        commit = "?"
    flags = Path("/proc/cpuinfo").read_text().split("flags\t\t: ", 1)[-1].split("\n", 1)[0].split()
    isa = [f for f in flags if f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")]
    return (f"commit {commit}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
            f"flags {' '.join(isa)}, panel width {cpu_kernels().linear_panel_width()}")


def bench_mlp(args) -> None:
    """The Qwen-shaped MLP at 2,048 rows, in 512-row tiles (``LlamaMLP.forward``) and untiled."""
    from kvserve.model.arch_config import ModelArchConfig
    from kvserve.model.invariant_linear import use_invariant_linears
    from kvserve.model.llama import LlamaMLP

    arch = ModelArchConfig.from_dict({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896,
                                      "intermediate_size": 4864, "num_attention_heads": 14, "num_hidden_layers": 1,
                                      "vocab_size": 32})
    for dtype, threads in itertools.product((torch.float32, torch.bfloat16), args.threads):
        torch.set_num_threads(threads)
        mlp = LlamaMLP(arch).to(dtype)
        use_invariant_linears(mlp)
        x = torch.randn(2048, 896).to(dtype)
        best = {"tiled": math.inf, "untiled": math.inf}
        with torch.inference_mode():
            for _ in range(args.rounds):
                best["tiled"] = min(best["tiled"], min(time_calls(lambda: mlp(x), 2)))
                best["untiled"] = min(best["untiled"], min(time_calls(lambda: mlp._swiglu(x), 2)))
        print(f"MLP 2048 rows {dtype} threads={threads}: tiled {best['tiled'] * 1e3:.1f} ms, "
              f"untiled {best['untiled'] * 1e3:.1f} ms, untiled/tiled {best['untiled'] / best['tiled']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", choices=sorted(SHAPES), help="default: all")
    parser.add_argument("--m", type=int, action="append", help=f"rows per call (default {ROWS})")
    parser.add_argument("--threads", type=int, action="append", help="default: 1 and 2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hot", action="store_true", help="reuse one weight copy (cache-resident)")
    parser.add_argument("--lm-head-max-m", type=int, default=256,
                        help="largest M for lm_head (it only sees sampled rows; default 256)")
    parser.add_argument("--torch-bf16-max-flop", type=float, default=2e10,
                        help="skip torch's bf16 F.linear above this many FLOP per call (slow without AVX512-BF16)")
    parser.add_argument("--json", type=Path, help="also write the cells here")
    parser.add_argument("--mlp", action="store_true", help="only the MLP tiling comparison")
    args = parser.parse_args()
    args.threads = args.threads or [1, 2]
    if cpu_kernels() is None:
        raise SystemExit("the C++ kernels did not build here")
    if args.mlp:
        bench_mlp(args)
        return
    provenance = header()
    print(provenance)
    print("| linear | M | threads | MKL fp32 ms | ours fp32 ms (vs MKL) | ours bf16 ms (vs MKL fp32) | "
          "torch bf16 ms (vs ours bf16) | ours bf16 GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    cells = []
    for threads, shape, rows in itertools.product(args.threads, args.shape or SHAPES, args.m or ROWS):
        if shape == "lm_head" and rows > args.lm_head_max_m:
            continue
        cells.append(measure_cell(shape, rows, threads, args))
        print(format_row(cells[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"header": provenance, "cells": [asdict(c) for c in cells]}, indent=1))


if __name__ == "__main__":
    main()
