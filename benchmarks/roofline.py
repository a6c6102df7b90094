"""Roofline lower bound of one decode step on this machine, and kvserve's step time against it.

The probe (``kvserve.bench.machine_probe``: read bandwidth, matmul peak, measured in the same
run) and the bound (``kvserve.bench.roofline``: weight, KV and FLOP counts from the model's
shapes in each serving format) are the ones ``kvserve bench`` reports beside its throughputs; this
script prints the bound of single decode steps::

    t_weights = weight bytes / bandwidth                           (every weight read once)
    t_kv      = B * L * layers * 2 * kv_heads * row bytes / bandwidth
    t_compute = (2 * matmul weights * B + 4 * B * L * layers * heads * head_dim) / matmul_peak
    bound     = max(t_weights + t_kv, t_compute)

for batch ``B`` and context ``L`` per request. With ``--measure``, the script then times
``ModelRunner.execute_model`` decode steps (forward + logits + greedy sampling,
``profile_decode.py``'s harness) at each batch and prints the step time as a multiple of the
bound (1.0 = at the roofline).

    python benchmarks/roofline.py --model /tmp/qwen-shaped --batch 1 --batch 64 --measure

Quantized weights (``--format``, repeatable; all measured in one process, one after another):
``bfloat16``, ``float32``, ``int8``, ``int8+lm_head``, ``int4-gG``, ``int4-gG+lm_head``
(``--quantization`` int8/int4 at load, activations bfloat16), each optionally ``+kv_int8``,
``+kv_fp8_e4m3`` or ``+kv_fp8_e5m2`` (``--kv-cache-dtype``: the KV term counts head_dim + 4 bytes
per row). ``t_weights`` is then the bytes of the format (packed integers and float32 scales,
float weights of the LM head and norms; the embedding row lookup is not counted) over the
bandwidth, and the line says the step as a multiple of that bound and of the first format's
step::

    python benchmarks/roofline.py --batch 1 --batch 64 --measure --format bfloat16 --format int8 \
        --format int8+lm_head --format int4-g32+lm_head
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict

import torch

from kvserve.bench.machine_probe import probe_machine
from kvserve.bench.roofline import ServingFormat, decode_step_bound, model_cost, quantization_from_label
from kvserve.checkpoint_quantization import resolve_quantization
from kvserve.config import QuantizationConfig
from kvserve.model.arch_config import ModelArchConfig


def parse_format(name: str) -> ServingFormat:
    """``bfloat16`` / ``float32`` / ``int8[+lm_head]`` / ``int4-gG[+lm_head]``, each with an
    optional ``+kv_int8|+kv_fp8_e4m3|+kv_fp8_e5m2``; quantized formats run bfloat16 activations."""
    name, _, kv = name.partition("+kv_")
    try:
        if name in ("bfloat16", "float32"):
            return ServingFormat(name, kv_cache_dtype=kv or "auto")
        return ServingFormat("bfloat16", quantization_from_label(name), kv or "auto")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def measure_steps(model: str, fmt: ServingFormat, batches: list[int], context: int,
                  steps: int, enforce_eager: bool = False) -> tuple[dict[int, float], str]:
    """(median decode-step seconds of kvserve per batch size, the loaded weights' description)
    with the engine's default attention backend."""
    from profile_decode import DecodeSteps, blocks_needed, time_steps  # noqa: PLC0415 - benchmarks/ sibling

    from kvserve.attention import get_attention_backend  # noqa: PLC0415
    from kvserve.model.loader import load_model  # noqa: PLC0415
    from kvserve.model.runner import ModelRunner  # noqa: PLC0415

    loaded = load_model(model, fmt.dtype, "cpu", get_attention_backend("auto"), fmt.quantization)
    block_size, extra = 16, 2 * steps + 4
    runner = ModelRunner(loaded, blocks_needed(batches, context, block_size, extra), block_size,
                         max_num_reqs=max(batches), max_model_len=context + max(batches) + extra + 4,
                         kv_cache_dtype=fmt.kv_cache_dtype, enforce_eager=enforce_eager)
    medians = {}
    for b in batches:
        step = DecodeSteps(runner, b, context, block_size, extra)
        medians[b] = statistics.median(time_steps(step, steps))
        step.finish()
    return medians, loaded.weight_format


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/tmp/qwen-shaped", help="checkpoint folder (its config.json)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 1, 32, 64)")
    parser.add_argument("--context", type=int, default=192, help="tokens per request in the cache")
    parser.add_argument("--measure", action="store_true", help="also time kvserve's decode step")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true",
                        help="run the model's modules, not the decoder layers' C++ loop (as kvserve serve's flag)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    parser.add_argument("--format", action="append", type=parse_format, default=None,
                        help="weight format (repeatable): bfloat16, float32, int8[+lm_head], int4-gG[+lm_head], "
                             "each with an optional +kv_int8|+kv_fp8_e4m3|+kv_fp8_e5m2; default: --dtype with the "
                             "checkpoint's own quantization (GPTQ/AWQ/MXFP4)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = args.batch or [1, 32, 64]
    arch = ModelArchConfig.from_file(f"{args.model}/config.json")
    # default: the dtype, with the checkpoint's own quantization where it has one (GPTQ/AWQ/MXFP4)
    formats = args.format or [ServingFormat(args.dtype, resolve_quantization(args.model, QuantizationConfig()))]
    peaks = probe_machine(arch.hidden_size, arch.intermediate_size, ("bfloat16", "float32"))
    print(f"machine ({peaks.threads} threads): bandwidth {peaks.bandwidth_gbs:.1f} GB/s (bf16 GEMV "
          f"{peaks.gemv_bf16_gbs:.1f}, fp32 sum {peaks.sum_fp32_gbs:.1f}); matmul bf16 "
          f"{peaks.matmul_tflops['bfloat16']:.2f} TFLOP/s, fp32 {peaks.matmul_tflops['float32']:.2f} TFLOP/s",
          flush=True)
    results, first = [], {}
    for fmt in formats:
        cost = model_cost(arch, fmt)
        measured, described = ({}, fmt.label)
        if args.measure:
            measured, described = measure_steps(args.model, fmt, batches, args.context, args.steps,
                                                   args.enforce_eager)
        rows = []
        for batch in batches:
            bound = decode_step_bound(cost, peaks, fmt.dtype, [args.context] * batch)
            row = {**asdict(bound), "context": args.context, "bound_s": bound.bound_s}
            line = (f"{fmt.label} ({described}) batch {batch:3d} context {args.context}: bound "
                    f"{bound.bound_s * 1e3:7.1f} ms (weights {bound.weights_s * 1e3:.1f} + kv "
                    f"{bound.kv_s * 1e3:.1f} ms, compute {bound.compute_s * 1e3:.1f} ms)")
            if batch in measured:
                row["step_s"] = measured[batch]
                first.setdefault(batch, measured[batch])
                line += (f"; kvserve {measured[batch] * 1e3:.1f} ms = {measured[batch] / bound.bound_s:.2f}x bound, "
                         f"{measured[batch] / first[batch]:.2f}x {formats[0].label}, "
                         f"{batch / measured[batch]:.1f} tok/s")
            rows.append(row)
            print(line, flush=True)
        results.append({"format": fmt.label, "weights": described, "weight_bytes": cost.weight_bytes, "steps": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peaks": peaks.to_dict(), "formats": results}, f, indent=2)


if __name__ == "__main__":
    main()
