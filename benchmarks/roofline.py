"""Roofline lower bound of one decode step on this machine, and kvserve's step time against it.

Measured in the same run (the machines here are shared and noisy, so a bound from another run is
worth little):

- memory bandwidth: a bfloat16 GEMV over a 256 MiB weight (the access pattern of decode at batch
  1: stream every weight once) and a float32 ``sum`` over 256 MiB; the larger is used;
- matmul peak: ``F.linear`` at M=1024 on the model's MLP shape (hidden -> intermediate), bfloat16
  and float32.

Lower bound of one decode step for a model with ``P`` parameters (tied embeddings counted once),
batch ``B``, context ``L`` per request, ``S`` bytes per element::

    t_weights = P * S / bandwidth                                  (every weight read once)
    t_kv      = B * L * layers * 2 * kv_heads * head_dim * S / bandwidth
    t_compute = (2 * P_matmul * B + 4 * B * L * layers * heads * head_dim) / matmul_peak
    bound     = max(t_weights + t_kv, t_compute)

(``P_matmul`` excludes the input embedding, which is a row lookup, unless tied to the LM head.)
With ``--measure``, the script then times ``ModelRunner.execute_model`` decode steps (forward +
logits + greedy sampling, ``profile_decode.py``'s harness) at each batch and prints the step time
as a multiple of the bound (1.0 = at the roofline).

    python benchmarks/roofline.py --model /tmp/qwen-shaped --batch 1 --batch 64 --measure
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from timing import time_calls

from kvserve.model.arch_config import ModelArchConfig


@dataclass(frozen=True)
class MachinePeaks:
    """Measured peaks. bandwidth_gbs: bytes/s / 1e9; *_tflops: FLOP/s / 1e12."""

    bandwidth_gbs: float
    gemv_bf16_gbs: float
    sum_fp32_gbs: float
    matmul_bf16_tflops: float
    matmul_fp32_tflops: float
    threads: int


def _best_time(fn, repeats: int) -> float:
    """Fastest of ``repeats`` calls, seconds (the least disturbed by other processes)."""
    return min(time_calls(fn, repeats))


def measure_bandwidth(size_bytes: int = 256 * 2**20, repeats: int = 8) -> tuple[float, float]:
    """(bf16 GEMV GB/s, fp32 sum GB/s) over ``size_bytes`` of data, best of ``repeats``."""
    cols = 4096
    weight = torch.randn(size_bytes // 2 // cols, cols).to(torch.bfloat16)
    x = torch.randn(1, cols).to(torch.bfloat16)
    gemv = weight.numel() * 2 / _best_time(lambda: F.linear(x, weight), repeats) / 1e9
    del weight
    data = torch.randn(size_bytes // 4)
    read = data.numel() * 4 / _best_time(lambda: data.sum(), repeats) / 1e9
    return gemv, read


def measure_matmul(dtype: torch.dtype, m: int, k: int, n: int, repeats: int = 5) -> float:
    """TFLOP/s of ``F.linear([m, k], [n, k])`` in ``dtype``, best of ``repeats``."""
    a = torch.randn(m, k).to(dtype)
    w = torch.randn(n, k).to(dtype)
    return 2 * m * k * n / _best_time(lambda: F.linear(a, w), repeats) / 1e12


def measure_peaks(arch: ModelArchConfig) -> MachinePeaks:
    gemv, read = measure_bandwidth()
    k, n = arch.hidden_size, 2 * arch.intermediate_size
    return MachinePeaks(
        bandwidth_gbs=max(gemv, read), gemv_bf16_gbs=gemv, sum_fp32_gbs=read,
        matmul_bf16_tflops=measure_matmul(torch.bfloat16, 1024, k, n),
        matmul_fp32_tflops=measure_matmul(torch.float32, 1024, k, n),
        threads=torch.get_num_threads(),
    )


@dataclass(frozen=True)
class StepBound:
    """Lower bound of one decode step, seconds, and its parts."""

    batch: int
    context: int
    weights_s: float
    kv_s: float
    compute_s: float

    @property
    def bound_s(self) -> float:
        return max(self.weights_s + self.kv_s, self.compute_s)


def parameter_counts(arch: ModelArchConfig) -> tuple[int, int]:
    """(all parameters with tied embeddings counted once, parameters that take part in matmuls)."""
    h, i, layers = arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
    if arch.attention_bias:
        per_layer += q + 2 * kv
    embed = arch.vocab_size * h
    lm_head = 0 if arch.tie_word_embeddings else embed
    total = layers * per_layer + embed + lm_head + h
    return total, total - (0 if arch.tie_word_embeddings else embed)


def decode_bound(arch: ModelArchConfig, peaks: MachinePeaks, batch: int, context: int, dtype: torch.dtype) -> StepBound:
    size = torch.empty((), dtype=dtype).element_size()
    total, matmul = parameter_counts(arch)
    bandwidth = peaks.bandwidth_gbs * 1e9
    peak = (peaks.matmul_bf16_tflops if dtype == torch.bfloat16 else peaks.matmul_fp32_tflops) * 1e12
    layers = arch.num_hidden_layers
    kv_bytes = batch * context * layers * 2 * arch.num_key_value_heads * arch.head_dim * size
    attn_flops = 4 * batch * context * layers * arch.num_attention_heads * arch.head_dim
    return StepBound(batch, context, total * size / bandwidth, kv_bytes / bandwidth,
                     (2 * matmul * batch + attn_flops) / peak)


def measure_steps(model: str, dtype: str, batches: list[int], context: int, steps: int) -> dict[int, float]:
    """Median decode-step seconds of kvserve per batch size (engine's default attention backend)."""
    from profile_decode import DecodeSteps, blocks_needed, time_steps  # noqa: PLC0415 - benchmarks/ sibling

    from kvserve.attention import get_attention_backend  # noqa: PLC0415
    from kvserve.model.loader import load_model  # noqa: PLC0415
    from kvserve.model.runner import ModelRunner  # noqa: PLC0415

    loaded = load_model(model, dtype, "cpu", get_attention_backend("auto"))
    block_size, extra = 16, 2 * steps + 4
    runner = ModelRunner(loaded, blocks_needed(batches, context, block_size, extra), block_size,
                         max_num_reqs=max(batches), max_model_len=context + max(batches) + extra + 4)
    medians = {}
    for b in batches:
        step = DecodeSteps(runner, b, context, block_size, extra)
        medians[b] = statistics.median(time_steps(step, steps))
        step.finish()
    return medians


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/tmp/qwen-shaped", help="checkpoint folder (its config.json)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 1, 32, 64)")
    parser.add_argument("--context", type=int, default=192, help="tokens per request in the cache")
    parser.add_argument("--measure", action="store_true", help="also time kvserve's decode step")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = args.batch or [1, 32, 64]
    arch = ModelArchConfig.from_file(f"{args.model}/config.json")
    dtype = getattr(torch, args.dtype)
    peaks = measure_peaks(arch)
    print(f"machine ({peaks.threads} threads): bandwidth {peaks.bandwidth_gbs:.1f} GB/s (bf16 GEMV "
          f"{peaks.gemv_bf16_gbs:.1f}, fp32 sum {peaks.sum_fp32_gbs:.1f}); matmul bf16 "
          f"{peaks.matmul_bf16_tflops:.2f} TFLOP/s, fp32 {peaks.matmul_fp32_tflops:.2f} TFLOP/s")
    measured = measure_steps(args.model, args.dtype, batches, args.context, args.steps) if args.measure else {}
    rows = []
    for batch in batches:
        bound = decode_bound(arch, peaks, batch, args.context, dtype)
        row = {**asdict(bound), "bound_s": bound.bound_s}
        line = (f"batch {batch:3d} context {args.context}: bound {bound.bound_s * 1e3:7.1f} ms "
                f"(weights {bound.weights_s * 1e3:.1f} + kv {bound.kv_s * 1e3:.1f} ms, compute "
                f"{bound.compute_s * 1e3:.1f} ms)")
        if batch in measured:
            row["step_s"] = measured[batch]
            line += f"; kvserve {measured[batch] * 1e3:.1f} ms = {measured[batch] / bound.bound_s:.2f}x bound"
        rows.append(row)
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peaks": asdict(peaks), "dtype": args.dtype, "steps": rows}, f, indent=2)


if __name__ == "__main__":
    main()
