"""Micro-benchmark of the sampler's random path, before/after ratios measured in one run.

``python benchmarks/bench_sampler.py [--rows 32] [--vocab 151936] [--threads 2]``

Compares, on the same logits:

- draw: exponential race (``argmax(p / q)``, ``V`` exponentials per row) against the inverse-CDF
  draw the sampler uses (``cumsum`` + ``searchsorted``, one uniform per row);
- top-p: full vocabulary sort against the sort-free candidates path (peaked logits, like a
  trained model's), and against the C++ threshold search (``kernels/csrc/top_p.cpp``) that flat
  logits take (a nucleus of tens of thousands of tokens);
- whole ``Sampler`` steps: greedy, greedy + logprobs, temperature, top-p, seeded.

Timings are medians of ``--repeats`` runs in milliseconds; they are for reading, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from timing import time_calls

from kvserve.kernels import cpu_kernels
from kvserve.request import Request
from kvserve.sample.sampler import Sampler, _inverse_cdf_sample
from kvserve.sample.top_k_top_p import _apply_top_p_from_candidates, _apply_top_p_sorted
from kvserve.sampling_params import SamplingParams
from kvserve.testing.sampling import sampling_metadata


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    return statistics.median(time_calls(fn, repeats)) * 1e3


def exponential_race(probs: torch.Tensor) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_().clamp_min_(torch.finfo(probs.dtype).tiny)
    return (probs / noise).argmax(dim=1)


def compare(name: str, before: float, after: float) -> None:
    print(f"{name:34s} before {before:9.2f} ms   after {after:9.2f} ms   x{before / after:6.1f}")


def sampler_steps(logits: torch.Tensor, repeats: int) -> None:
    rows, vocab_size = logits.shape
    cases = {
        "greedy": dict(temperature=0.0),
        "greedy + logprobs=5": dict(temperature=0.0, logprobs=5),
        "temperature 0.8": dict(temperature=0.8),
        "top_p 0.9": dict(top_p=0.9),
        "seeded": dict(seed=1),
    }
    sampler = Sampler(torch.Generator().manual_seed(0))
    for name, params in cases.items():
        requests = [Request.of(f"r{i}", [1, 2, 3], SamplingParams(**params)) for i in range(rows)]
        generators = [torch.Generator().manual_seed(i) if "seed" in params else None for i in range(rows)]
        metadata = sampling_metadata(requests, vocab_size, generators)
        print(f"Sampler step, {name:21s} {median_ms(lambda: sampler(logits, metadata), repeats):9.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    # Scale 6: the 0.9-nucleus of each row holds ~100 tokens (scale 4: ~1,300, a flat model).
    peaked = torch.randn(args.rows, args.vocab, generator=generator) * 6.0
    probs = peaked.softmax(dim=1)
    uniforms = torch.rand(args.rows, dtype=torch.float64, generator=generator)
    compare("draw: exp race -> inverse CDF",
            median_ms(lambda: exponential_race(probs), args.repeats),
            median_ms(lambda: _inverse_cdf_sample(probs, uniforms), args.repeats))
    top_p = torch.full((args.rows,), 0.9)
    off = torch.zeros(args.rows, dtype=torch.bool)
    assert not _apply_top_p_from_candidates(peaked.clone(), top_p, off, 256).any(), "nucleus wider than 256"
    compare("top-p 0.9: sort -> candidates",
            median_ms(lambda: _apply_top_p_sorted(peaked.clone(), top_p, off), args.repeats),
            median_ms(lambda: _apply_top_p_from_candidates(peaked.clone(), top_p, off, 256), args.repeats))
    flat = torch.randn(args.rows, args.vocab, generator=generator)
    rows = torch.arange(args.rows)
    kernels = cpu_kernels()
    if kernels is not None:
        compare("top-p 0.9, flat rows: sort -> C++",
                median_ms(lambda: _apply_top_p_sorted(flat.clone(), top_p, off), args.repeats),
                median_ms(lambda: kernels.top_p_rows(flat.clone(), rows, top_p, None), args.repeats))
    print("peaked logits:")
    sampler_steps(peaked, args.repeats)
    print("flat logits:")
    sampler_steps(flat, args.repeats)


if __name__ == "__main__":
    main()
