"""Perplexity of a served model on a text, through the engine's own prompt scoring.

Each window of the text's tokens is one request with ``prompt_logprobs=0`` and ``max_tokens=0``:
the engine runs it like any prompt (prefill in the batch, the KV cache written and read by the
attention backend, the weights' own GEMM) and returns the logprob of every token given the ones
before it in its window. Perplexity is ``exp(-mean logprob)`` over every scored token (the first
token of each window has no context and is not scored), the usual definition (Jelinek et al.
1977) applied to non-overlapping windows.
"""

from __future__ import annotations

import math

from kvserve.sampling_params import SamplingParams


def token_windows(token_ids: list[int], size: int) -> list[list[int]]:
    """Consecutive non-overlapping windows of ``size`` tokens (a shorter last one kept if it has
    at least two tokens)."""
    windows = [token_ids[i:i + size] for i in range(0, len(token_ids), size)]
    return [w for w in windows if len(w) >= 2]


def window_logprobs(llm, windows: list[list[int]]) -> list[float]:
    """The logprob of every scored token of every window (``llm``: a ``kvserve.LLM``)."""
    params = SamplingParams(max_tokens=0, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False)
    return [entry.logprob for out in outputs for entry in out.prompt_logprobs[1:]]


def perplexity(llm, windows: list[list[int]]) -> float:
    """``exp(-mean logprob)`` over the windows (module docstring)."""
    logprobs = window_logprobs(llm, windows)
    return math.exp(-sum(logprobs) / len(logprobs))
