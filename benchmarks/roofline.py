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

Quantized weights (``--format``, repeatable; all measured in one process, one after another):
``bfloat16``, ``float32``, ``int8``, ``int8+lm_head``, ``int4-gG``, ``int4-gG+lm_head``
(``--quantization`` int8/int4 at load, activations bfloat16), each optionally ``+kv_int8``,
``+kv_fp8_e4m3`` or ``+kv_fp8_e5m2`` (``--kv-cache-dtype``: the KV term counts head_dim + 4 bytes
per row). ``t_weights`` is then the bytes a
decode step reads from the loaded model's own linears (packed integers, float32 scales and
offsets, float weights of the LM head and norms; the embedding row lookup is not counted) over
the bandwidth, and the line says the step as a multiple of that bound and of the first format's
step::

    python benchmarks/roofline.py --batch 1 --batch 64 --measure --format bfloat16 --format int8 \
        --format int8+lm_head --format int4-g32+lm_head
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


def decode_bound(arch: ModelArchConfig, peaks: MachinePeaks, batch: int, context: int, dtype: torch.dtype,
                 weight_bytes: int | None = None, kv_cache_dtype: str = "auto") -> StepBound:
    """``weight_bytes``: bytes of weights one step reads (default: every parameter in ``dtype``)."""
    size = torch.empty((), dtype=dtype).element_size()
    kv_row = arch.head_dim * size if kv_cache_dtype == "auto" else arch.head_dim + 4
    total, matmul = parameter_counts(arch)
    weight_bytes = total * size if weight_bytes is None else weight_bytes
    bandwidth = peaks.bandwidth_gbs * 1e9
    peak = (peaks.matmul_bf16_tflops if dtype == torch.bfloat16 else peaks.matmul_fp32_tflops) * 1e12
    layers = arch.num_hidden_layers
    kv_bytes = batch * context * layers * 2 * arch.num_key_value_heads * kv_row
    attn_flops = 4 * batch * context * layers * arch.num_attention_heads * arch.head_dim
    return StepBound(batch, context, weight_bytes / bandwidth, kv_bytes / bandwidth,
                     (2 * matmul * batch + attn_flops) / peak)


def parse_format(name: str):
    """``bfloat16`` / ``float32`` / ``int8[+lm_head]`` / ``int4-gG[+lm_head]``, each with an
    optional ``+kv_int8|+kv_fp8_e4m3|+kv_fp8_e5m2`` -> (dtype name, ``QuantizationConfig``, KV
    cache dtype); quantized formats run bfloat16 activations."""
    from kvserve.config import QuantizationConfig  # noqa: PLC0415

    name, _, kv = name.partition("+kv_")
    kv = kv or "auto"
    if kv not in ("auto", "int8", "fp8_e4m3", "fp8_e5m2"):
        raise argparse.ArgumentTypeError(f"unknown KV cache dtype {kv!r}; +kv_int8, +kv_fp8_e4m3 or +kv_fp8_e5m2")
    if name in ("bfloat16", "float32"):
        return name, QuantizationConfig(), kv
    method, _, head = name.partition("+")
    if head not in ("", "lm_head"):
        raise argparse.ArgumentTypeError(f"unknown format {name!r}")
    base, _, group = method.partition("-g")
    if base not in ("int8", "int4") or (base == "int4") != bool(group):
        raise argparse.ArgumentTypeError(f"unknown format {name!r}; e.g. int8, int8+lm_head, int4-g32+lm_head")
    return "bfloat16", QuantizationConfig(base, int(group) if group else 32, head == "lm_head"), kv


def step_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every linear's stored weight (packed float or
    integers with their scales and offsets) and every norm; the embedding table counts only as
    the LM head's weight (a row lookup otherwise)."""
    from kvserve.model.invariant_linear import InvariantLinear  # noqa: PLC0415
    from kvserve.model.quant_linear import QuantizedLinear  # noqa: PLC0415

    total = 0
    for module in model.modules():
        tensors = []
        if isinstance(module, QuantizedLinear):
            tensors = [module.packed, module.scales, module.neg_offsets]
        elif isinstance(module, InvariantLinear):
            tensors = [module.packed]
        elif isinstance(module, torch.nn.Linear):
            tensors = [module.weight]
        elif type(module).__name__ == "RMSNorm":
            tensors = [module.weight]
        total += sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return total


def measure_steps(model: str, dtype: str, batches: list[int], context: int, steps: int,
                  quantization=None, kv_cache_dtype: str = "auto") -> tuple[dict[int, float], int, str]:
    """(median decode-step seconds of kvserve per batch size, weight bytes per step, the weights'
    description) with the engine's default attention backend."""
    from profile_decode import DecodeSteps, blocks_needed, time_steps  # noqa: PLC0415 - benchmarks/ sibling

    from kvserve.attention import get_attention_backend  # noqa: PLC0415
    from kvserve.config import QuantizationConfig  # noqa: PLC0415
    from kvserve.model.loader import load_model  # noqa: PLC0415
    from kvserve.model.runner import ModelRunner  # noqa: PLC0415

    loaded = load_model(model, dtype, "cpu", get_attention_backend("auto"), quantization or QuantizationConfig())
    block_size, extra = 16, 2 * steps + 4
    runner = ModelRunner(loaded, blocks_needed(batches, context, block_size, extra), block_size,
                         max_num_reqs=max(batches), max_model_len=context + max(batches) + extra + 4,
                         kv_cache_dtype=kv_cache_dtype)
    medians = {}
    for b in batches:
        step = DecodeSteps(runner, b, context, block_size, extra)
        medians[b] = statistics.median(time_steps(step, steps))
        step.finish()
    return medians, step_weight_bytes(runner.model), loaded.weight_format


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
    parser.add_argument("--format", action="append", default=None,
                        help="weight format (repeatable): bfloat16, float32, int8[+lm_head], int4-gG[+lm_head]; "
                             "default: --dtype")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = args.batch or [1, 32, 64]
    arch = ModelArchConfig.from_file(f"{args.model}/config.json")
    peaks = measure_peaks(arch)
    print(f"machine ({peaks.threads} threads): bandwidth {peaks.bandwidth_gbs:.1f} GB/s (bf16 GEMV "
          f"{peaks.gemv_bf16_gbs:.1f}, fp32 sum {peaks.sum_fp32_gbs:.1f}); matmul bf16 "
          f"{peaks.matmul_bf16_tflops:.2f} TFLOP/s, fp32 {peaks.matmul_fp32_tflops:.2f} TFLOP/s", flush=True)
    formats = args.format or [args.dtype]
    results, first = [], {}
    for name in formats:
        dtype_name, quantization, kv = parse_format(name)
        measured, weight_bytes, described = ({}, None, name)
        if args.measure:
            measured, weight_bytes, described = measure_steps(args.model, dtype_name, batches, args.context,
                                                              args.steps, quantization, kv)
        rows = []
        for batch in batches:
            bound = decode_bound(arch, peaks, batch, args.context, getattr(torch, dtype_name), weight_bytes, kv)
            row = {**asdict(bound), "bound_s": bound.bound_s}
            line = (f"{name} ({described}) batch {batch:3d} context {args.context}: bound {bound.bound_s * 1e3:7.1f} ms "
                    f"(weights {bound.weights_s * 1e3:.1f} + kv {bound.kv_s * 1e3:.1f} ms, compute "
                    f"{bound.compute_s * 1e3:.1f} ms)")
            if batch in measured:
                row["step_s"] = measured[batch]
                first.setdefault(batch, measured[batch])
                line += (f"; kvserve {measured[batch] * 1e3:.1f} ms = {measured[batch] / bound.bound_s:.2f}x bound, "
                         f"{measured[batch] / first[batch]:.2f}x {formats[0]}, {batch / measured[batch]:.1f} tok/s")
            rows.append(row)
            print(line, flush=True)
        results.append({"format": name, "weights": described, "weight_bytes": weight_bytes, "steps": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peaks": asdict(peaks), "formats": results}, f, indent=2)


if __name__ == "__main__":
    main()
