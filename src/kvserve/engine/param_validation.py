"""Validation of ``SamplingParams``: every range and type rule, called only by the input processor
(``kvserve.engine.input_processor``), so the HTTP API and the offline ``LLM`` refuse the same
values with the same message. Ranges follow vLLM's ``SamplingParams`` and the OpenAI API."""

from __future__ import annotations

import math

from kvserve.errors import InvalidRequestError
from kvserve.sampling_params import SamplingParams

MAX_LOGPROBS = 20
SEED_MIN, SEED_END = -(2**63), 2**63  # int64, as vLLM's API
FLOAT32_MAX = 3.4028234663852886e38  # temperature and repetition_penalty are applied in float32


def _bad(param: str, message: str) -> None:
    raise InvalidRequestError(message, param=param)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_sampling_params(params: SamplingParams, vocab_size: int) -> None:
    """Check every field of ``params`` (see ``SamplingParams`` for the ranges).

    Raises:
        InvalidRequestError: the first value out of range; ``param`` names the field.
    """
    _validate_counts(params)
    _validate_floats(params)
    _validate_logprobs(params)
    _validate_stops(params)
    _validate_token_ids(params, vocab_size)
    if params.seed is not None and (not _is_int(params.seed) or not SEED_MIN <= params.seed < SEED_END):
        _bad("seed", f"seed must be an integer in [-2**63, 2**63 - 1], got {params.seed!r}")


def _validate_counts(params: SamplingParams) -> None:
    if not _is_int(params.n) or params.n < 1:
        _bad("n", f"n must be an integer >= 1, got {params.n!r}")
    if params.n > 1 and params.is_greedy:  # vLLM's rule and words: n greedy copies would be identical
        _bad("n", f"n must be 1 when using greedy sampling, got {params.n}.")
    if not _is_int(params.top_k) or params.top_k < 0:
        _bad("top_k", f"top_k must be -1 (disable) or >= 1, got {params.top_k!r}")
    if params.max_tokens is not None and (not _is_int(params.max_tokens) or params.max_tokens < 0):
        _bad("max_tokens", f"max_tokens must be >= 0 (0 = score the prompt only), got {params.max_tokens!r}")
    if not _is_int(params.min_tokens) or params.min_tokens < 0:
        _bad("min_tokens", f"min_tokens must be >= 0, got {params.min_tokens!r}")
    if params.max_tokens is not None and params.min_tokens > params.max_tokens:
        _bad("min_tokens", f"min_tokens ({params.min_tokens}) must be <= max_tokens ({params.max_tokens})")
    limit = params.truncate_prompt_tokens
    if limit is not None and (not _is_int(limit) or (limit < 1 and limit != -1)):
        _bad("truncate_prompt_tokens", f"truncate_prompt_tokens must be an integer >= 1 (the number of prompt "
             f"tokens to keep, counted from the end) or -1 (the context length), got {limit!r}")


def _validate_floats(params: SamplingParams) -> None:
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = getattr(params, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            _bad(name, f"{name} must be a finite number, got {value!r}")
    if params.temperature < 0:
        _bad("temperature", f"temperature must be >= 0, got {params.temperature}")
    for name in ("temperature", "repetition_penalty"):
        # float32 rounds a larger value to inf: -inf logits / inf are NaN and the row lost its
        # distribution (a truncated row then took the argmax instead of sampling).
        if getattr(params, name) > FLOAT32_MAX:
            _bad(name, f"{name} must be at most {FLOAT32_MAX:.7g} (a float32), got {getattr(params, name)}")
    if not 0 < params.top_p <= 1:
        _bad("top_p", f"top_p must be in (0, 1], got {params.top_p}")
    if not 0 <= params.min_p <= 1:
        _bad("min_p", f"min_p must be in [0, 1], got {params.min_p}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if not -2 <= value <= 2:
            _bad(name, f"{name} must be in [-2, 2], got {value}")
    if params.repetition_penalty <= 0:
        _bad("repetition_penalty", f"repetition_penalty must be > 0, got {params.repetition_penalty}")


def _validate_logprobs(params: SamplingParams) -> None:
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and (not _is_int(value) or not 0 <= value <= MAX_LOGPROBS):
            _bad(name, f"{name} must be in [0, {MAX_LOGPROBS}], got {value!r}")


def _validate_stops(params: SamplingParams) -> None:
    if any(not isinstance(s, str) or not s for s in params.stop):
        _bad("stop", "stop strings must be non-empty")
    for word in params.bad_words:
        if not isinstance(word, str) or not word.strip():
            _bad("bad_words", f"bad_words entries must be non-empty words, got {word!r}")


def _validate_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """``logit_bias``, ``stop_token_ids`` and ``allowed_token_ids``: token ids in the vocabulary."""
    top = vocab_size - 1
    for token_id, bias in (params.logit_bias or {}).items():
        if not _is_int(token_id) or token_id < 0:
            _bad("logit_bias", f"logit_bias keys must be token ids (integers >= 0), got {token_id!r}")
        if token_id > top:
            _bad("logit_bias", f"logit_bias key {token_id} is out of the vocabulary (token ids are 0..{top})")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias):
            _bad("logit_bias", f"logit_bias values must be numbers, got {bias} for token {token_id}")
    for token_id in params.stop_token_ids:
        if not _is_int(token_id) or not 0 <= token_id <= top:
            _bad("stop_token_ids", f"stop_token_ids entry {token_id} is out of the vocabulary (0..{top})")
    if params.allowed_token_ids is not None:
        if not params.allowed_token_ids:
            _bad("allowed_token_ids", "allowed_token_ids must not be empty (omit it to allow every token)")
        for token_id in params.allowed_token_ids:
            if not _is_int(token_id) or token_id < 0:
                _bad("allowed_token_ids", f"allowed_token_ids must be token ids (integers >= 0), got {token_id!r}")
            if token_id > top:
                _bad("allowed_token_ids",
                     f"allowed_token_ids entry {token_id} is out of the vocabulary (token ids are 0..{top})")
