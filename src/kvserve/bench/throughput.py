"""Offline throughput: the whole workload through the in-process engine in one ``generate`` call.

No HTTP, no arrivals: this measures what the engine alone sustains (vLLM's
``benchmark_throughput``). Prompts are passed as token ids so their lengths are exact; output
tokens are counted from the returned ``CompletionOutput.token_ids``. The engine is
``kvserve.engine.llm.LLM``, imported only when this runs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvserve.bench.datasets import SampleRequest
from kvserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class ThroughputResult:
    """Totals of one offline run; throughputs per second of ``elapsed_s`` (the ``generate`` call,
    engine start-up excluded; ``load_s`` is the start-up)."""

    num_requests: int
    total_input_tokens: int
    total_output_tokens: int
    expected_output_tokens: int
    elapsed_s: float
    load_s: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    spec_decoding: dict[str, Any] | None = None  # acceptance when the engine speculated
    engine: dict[str, Any] | None = None  # ``serving_facts`` of the engine (None: a stand-in)
    request_lengths: tuple[tuple[int, int], ...] = dataclasses.field(default=(), repr=False)  # (prompt, output)


def sampling_params_for(samples: Sequence[SampleRequest], ignore_eos: bool, temperature: float) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt, asking for its ``expected_output_len`` tokens."""
    return [
        SamplingParams(temperature=temperature, max_tokens=s.expected_output_len, ignore_eos=ignore_eos)
        for s in samples
    ]


def summarize(samples: Sequence[SampleRequest], outputs: Sequence[Any], elapsed_s: float,
              load_s: float) -> ThroughputResult:
    """Totals from ``RequestOutput``s (one per sample, same order).

    Raises:
        ValueError: the engine returned a different number of outputs than prompts, or
            ``elapsed_s`` <= 0.
    """
    if len(outputs) != len(samples):
        raise ValueError(f"the engine returned {len(outputs)} outputs for {len(samples)} prompts")
    if elapsed_s <= 0:
        raise ValueError(f"elapsed time must be > 0 s, got {elapsed_s}")
    total_in = sum(len(o.prompt_token_ids) for o in outputs)
    total_out = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return ThroughputResult(
        num_requests=len(samples),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        expected_output_tokens=sum(s.expected_output_len for s in samples),
        elapsed_s=elapsed_s,
        load_s=load_s,
        request_throughput=len(samples) / elapsed_s,
        output_throughput=total_out / elapsed_s,
        total_token_throughput=(total_in + total_out) / elapsed_s,
        request_lengths=tuple((len(o.prompt_token_ids), sum(len(c.token_ids) for c in o.outputs)) for o in outputs),
    )


def format_throughput(result: ThroughputResult) -> str:
    """A summary in the words of vLLM's ``vllm bench throughput``, plus kvserve's timings."""
    return "\n".join([
        f"Throughput: {result.request_throughput:.2f} requests/s, {result.total_token_throughput:.2f} total tokens/s, "
        f"{result.output_throughput:.2f} output tokens/s",
        f"Total num prompt tokens:  {result.total_input_tokens}",
        f"Total num output tokens:  {result.total_output_tokens} (asked for {result.expected_output_tokens})",
        f"Requests: {result.num_requests}, generate time: {result.elapsed_s:.2f} s, engine start-up: "
        f"{result.load_s:.2f} s",
    ] + ([] if not result.spec_decoding else [
        f"Spec decode acceptance: {100 * result.spec_decoding['acceptance_rate']:.1f}% of "
        f"{result.spec_decoding['num_draft_tokens']} draft tokens, mean acceptance length "
        f"{result.spec_decoding['mean_acceptance_length']:.2f}"]))


def run_throughput(model: str, samples: Sequence[SampleRequest], engine_kwargs: dict[str, Any],
                   ignore_eos: bool = False, temperature: float = 1.0) -> ThroughputResult:
    """Load ``LLM(model=model, **engine_kwargs)`` and generate every sample at once.

    Raises:
        ImportError: ``kvserve.engine.llm`` is not available in this build.
    """
    from kvserve.engine.llm import LLM

    t0 = time.perf_counter()
    llm = LLM(model=model, **engine_kwargs)
    load_s = time.perf_counter() - t0
    prompts = [list(s.prompt_token_ids) for s in samples]
    params = sampling_params_for(samples, ignore_eos, temperature)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    result = summarize(samples, outputs, elapsed, load_s)
    core = getattr(getattr(llm, "llm_engine", None), "core", None)  # None: a stand-in engine (tests)
    if core is not None:
        result = dataclasses.replace(result, engine=core.serving_facts())
    spec = None if core is None else core.scheduler.make_stats().spec_decoding
    if spec is None or not spec.num_drafts:
        return result
    return dataclasses.replace(result, spec_decoding={
        "num_drafts": spec.num_drafts, "num_draft_tokens": spec.num_draft_tokens,
        "num_accepted_tokens": spec.num_accepted_tokens, "acceptance_rate": spec.acceptance_rate,
        "mean_acceptance_length": spec.mean_acceptance_length,
        "num_accepted_tokens_per_pos": list(spec.num_accepted_tokens_per_pos)})
