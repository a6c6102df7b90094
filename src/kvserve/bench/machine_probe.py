"""What this machine can do at best: read bandwidth and matmul peak, measured in a few seconds.

The roofline bound of a benchmark (``kvserve.bench.roofline``) divides bytes by a bandwidth and
FLOPs by a peak; both are measured here, in the same run as the benchmark, because the machines
this project runs on are shared and vary from minute to minute (docs/benchmarks.md, section 1.4):

- read bandwidth: a bfloat16 GEMV over ``size_bytes`` of weights (decode at batch 1: every weight
  streamed once) and a float32 ``sum`` over ``size_bytes``; the larger is the bandwidth. On the CPU
  both read huge pages (``kvserve.huge_pages``), as the engine's weights and KV cache do: from 4 KiB
  pages the same reads run at about two thirds of the speed (docs/benchmarks.md section 3.4);
- matmul peak: the faster of ``F.linear([m, k], [n, k])`` and, on the CPU, kvserve's own linear
  (``InvariantLinear``: AMX tiles or vector FMAs, what the engine runs) per dtype, on the model's
  MLP shape (``k`` = hidden, ``n`` = 2 x intermediate, ``m`` = 1,024 rows: large enough for the
  peak, small enough to be quick). A bound the engine can beat is no bound: on the AMX host
  kvserve's bfloat16 kernel ran this shape at 1.9-2.0 TFLOP/s where torch's read 1.3-1.7
  (docs/benchmarks.md section 1.3).

Each figure is the fastest of a few calls after one untimed warm-up (the call least disturbed by
other processes). On a CUDA device every call is synchronized. The probe uses the calling
process's threads (``torch.get_num_threads()``, recorded): run it where the engine runs, or say
that it was not.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvserve import huge_pages
from kvserve.kernels import kernels_for
from kvserve.model.invariant_linear import SUPPORTED_DTYPES, InvariantLinear

PROBE_BYTES = 256 * 2**20  # 8x the largest L3 of these machines: the reads come from memory
PROBE_ROWS = 1024


@dataclass(frozen=True)
class MachinePeaks:
    """Measured peaks of one device.

    Attributes:
        device: ``cpu`` or ``cuda:N``.
        threads: ``torch.get_num_threads()`` during the probe.
        bandwidth_gbs: read bandwidth, bytes/s / 1e9 (the larger of the two below).
        gemv_bf16_gbs: bfloat16 GEMV, weight bytes / s / 1e9.
        sum_fp32_gbs: float32 ``sum``, bytes / s / 1e9.
        matmul_tflops: dtype name -> FLOP/s / 1e12 of ``F.linear`` at ``matmul_shape``.
        matmul_shape: (m, k, n) of the matmul probe.
        probe_s: wall time of the whole probe, seconds.
    """

    device: str
    threads: int
    bandwidth_gbs: float
    gemv_bf16_gbs: float
    sum_fp32_gbs: float
    matmul_tflops: dict[str, float]
    matmul_shape: tuple[int, int, int]
    probe_s: float

    def peak_flops(self, dtype: str) -> float:
        """FLOP/s of ``dtype``'s matmul.

        Raises:
            KeyError: ``dtype`` was not probed.
        """
        return self.matmul_tflops[dtype] * 1e12

    @property
    def bandwidth(self) -> float:
        """Bytes/s."""
        return self.bandwidth_gbs * 1e9

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self, dtype: str) -> str:
        """e.g. ``25.0 GB/s, bfloat16 matmul 2.80 TFLOP/s (2 threads)``."""
        return (f"{self.bandwidth_gbs:.1f} GB/s, {dtype} matmul {self.matmul_tflops[dtype]:.2f} TFLOP/s "
                f"({self.threads} threads)")


def _best_time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` after one untimed call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def measure_bandwidth(size_bytes: int = PROBE_BYTES, repeats: int = 8,
                      device: str | torch.device = "cpu") -> tuple[float, float]:
    """(bfloat16 GEMV GB/s, float32 ``sum`` GB/s) over ``size_bytes`` of data, best of ``repeats``."""
    device = torch.device(device)
    cols = 4096

    def filled(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if device.type == "cpu":
            return huge_pages.empty(shape, dtype).fill_(0.5)
        return torch.full(shape, 0.5, dtype=dtype, device=device)

    weight = filled((size_bytes // 2 // cols, cols), torch.bfloat16)
    x = torch.full((1, cols), 0.25, dtype=torch.bfloat16, device=device)
    gemv = weight.numel() * 2 / _best_time(lambda: F.linear(x, weight), repeats, device) / 1e9
    del weight
    data = filled((size_bytes // 4,), torch.float32)
    read = data.numel() * 4 / _best_time(lambda: data.sum(), repeats, device) / 1e9
    return gemv, read


def measure_matmul(dtype: torch.dtype, m: int, k: int, n: int, repeats: int = 5,
                   device: str | torch.device = "cpu") -> float:
    """TFLOP/s of ``[m, k] x [n, k]^T`` in ``dtype``, best of ``repeats``: ``F.linear`` or, on the
    CPU where kvserve's kernels build, its ``InvariantLinear``, whichever is faster."""
    device = torch.device(device)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(device=device, dtype=dtype)
    w = torch.randn(n, k, generator=generator).to(device=device, dtype=dtype)
    best = _best_time(lambda: F.linear(a, w), repeats, device)
    kernels = kernels_for(device) if dtype in SUPPORTED_DTYPES else None
    if kernels is not None:
        linear = nn.Linear(k, n, bias=False, dtype=dtype)
        linear.weight.data = w
        own = InvariantLinear(linear, kernels)
        best = min(best, _best_time(lambda: own(a), repeats, device))
    return 2 * m * k * n / best / 1e12


def probe_machine(hidden_size: int, intermediate_size: int, dtypes: Sequence[str] = ("bfloat16",),
                  device: str | torch.device = "cpu", size_bytes: int = PROBE_BYTES) -> MachinePeaks:
    """Bandwidth and the matmul peak of each of ``dtypes`` (``bfloat16``, ``float32``,
    ``float16``) on the MLP shape of a model with these sizes (module docstring)."""
    start = time.perf_counter()
    device = torch.device(device)
    gemv, read = measure_bandwidth(size_bytes, device=device)
    shape = (PROBE_ROWS, hidden_size, 2 * intermediate_size)
    peaks = {name: measure_matmul(getattr(torch, name), *shape, device=device) for name in dict.fromkeys(dtypes)}
    return MachinePeaks(
        device=str(device), threads=torch.get_num_threads(), bandwidth_gbs=max(gemv, read), gemv_bf16_gbs=gemv,
        sum_fp32_gbs=read, matmul_tflops=peaks, matmul_shape=shape, probe_s=time.perf_counter() - start,
    )
