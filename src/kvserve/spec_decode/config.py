"""``--speculative-config``: vLLM's JSON object into a frozen :class:`SpeculativeConfig`.

Accepted (vLLM's keys and meanings, ``vllm/config/speculative.py``)::

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    {"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 4}
    {"model": "ngram", "num_speculative_tokens": 4}          # method from model, as vLLM infers it

``method`` missing: ``ngram`` when ``model`` is ``ngram`` or ``[ngram]``, else ``draft_model``.
n-gram lengths: neither given = 5 and 5 (vLLM's defaults); one given = the other takes its value.
kvserve's own keys tune the adaptive switch (``disable_by_batch_size``, ``min_acceptance_rate``).
Any other vLLM key (eagle, medusa, draft tensor parallelism, quantized drafts, ...) is refused by
name with why.
"""

from __future__ import annotations

import json
from typing import Any

from kvserve.config import SpeculativeConfig
from kvserve.errors import ConfigError

FLAG = "--speculative-config"
METHODS = ("ngram", "draft_model")
# Defaults of kvserve's switch; the measured break-even is in docs/speculative_decoding.md
# ("The adaptive switch") and docs/benchmarks.md section 5.3.
DEFAULT_DISABLE_BY_BATCH_SIZE = 16
DEFAULT_MIN_ACCEPTANCE_RATE = 0.1

# vLLM keys kvserve does not implement, with why.
_REFUSED_KEYS = {
    "draft_tensor_parallel_size": "the draft model runs whole on one device (rank 0 under -tp)",
    "tensor_parallel_size": "the draft model runs whole on one device (rank 0 under -tp)",
    "quantization": "quantized draft weights are not implemented",
    "kv_cache_dtype": "the draft's KV cache has the model's dtype",
    "revision": "a local folder has no revisions",
    "code_revision": "a local folder has no revisions",
    "max_model_len": "the draft model serves the target's context length",
    "disable_padded_drafter_batch": "the drafter's batch is never padded",
    "speculative_token_tree": "tree drafts are not implemented; drafts are one chain",
    "parallel_drafting": "drafts are proposed one after another",
    "num_speculative_tokens_per_batch_size": "use disable_by_batch_size (kvserve's batch-level switch)",
    "rejection_sample_method": "verification is standard rejection sampling",
    "draft_sample_method": "drafts are greedy (vLLM's default): the draft model proposes its argmax",
    "attention_backend": "the draft model uses the target's attention backend",
    "moe_backend": "kvserve runs dense models only",
    "use_heterogeneous_vocab": "the draft model must share the target's vocabulary",
    "suffix_decoding_max_tree_depth": "suffix decoding is not implemented",
    "suffix_decoding_max_cached_requests": "suffix decoding is not implemented",
    "suffix_decoding_max_spec_factor": "suffix decoding is not implemented",
    "suffix_decoding_min_token_prob": "suffix decoding is not implemented",
}
_IGNORED_KEYS = {"enforce_eager"}  # the engine's --enforce-eager applies to the draft too
_KNOWN_KEYS = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model",
               "disable_by_batch_size", "min_acceptance_rate"}


def _int(values: dict[str, Any], key: str, least: int) -> int | None:
    value = values.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{FLAG}: {key} must be an integer >= {least}, got {value!r}")
    return value


def _method(values: dict[str, Any]) -> str:
    method, model = values.get("method"), values.get("model")
    if method is None:
        method = "ngram" if model in ("ngram", "[ngram]") else "draft_model"
    if method == "[ngram]":
        method = "ngram"
    if method not in METHODS:
        raise ConfigError(f"{FLAG}: method {method!r} is not implemented; kvserve speculates with "
                          f"{' or '.join(METHODS)}")
    return method


def _check_keys(values: dict[str, Any]) -> None:
    for key in values:
        if key in _REFUSED_KEYS:
            raise ConfigError(f"{FLAG}: {key} is not supported: {_REFUSED_KEYS[key]}")
        if key not in _KNOWN_KEYS and key not in _IGNORED_KEYS:
            raise ConfigError(f"{FLAG}: unknown key {key!r}; known: {', '.join(sorted(_KNOWN_KEYS))}")


def _lookup_lengths(values: dict[str, Any]) -> tuple[int, int]:
    """(max, min) n-gram lengths with vLLM's defaults (5 and 5; one given = both)."""
    most, least = _int(values, "prompt_lookup_max", 1), _int(values, "prompt_lookup_min", 1)
    if most is None and least is None:
        most = least = 5
    most = least if most is None else most
    least = most if least is None else least
    if least > most:
        raise ConfigError(f"{FLAG}: prompt_lookup_min={least} must be <= prompt_lookup_max={most}")
    return most, least


def speculative_config_from_json(raw: str | dict[str, Any] | None) -> SpeculativeConfig | None:
    """Parse ``--speculative-config`` (a JSON object, or a dict from ``LLM(speculative_config=...)``).

    Returns:
        the config, or None when ``raw`` is None or empty (no speculation).

    Raises:
        ConfigError: not a JSON object, an unknown or refused key, a method other than ngram and
            draft_model, a missing or invalid value (the message names the key).
    """
    if raw is None or raw == "" or raw == {}:
        return None
    try:
        values = dict(json.loads(raw) if isinstance(raw, str) else raw)
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ConfigError(f"{FLAG} must be a JSON object: {exc}") from None
    _check_keys(values)
    method = _method(values)
    k = _int(values, "num_speculative_tokens", 1)
    if k is None:
        raise ConfigError(f"{FLAG}: num_speculative_tokens is required (an integer >= 1)")
    batch = _int(values, "disable_by_batch_size", 0)
    rate = values.get("min_acceptance_rate", DEFAULT_MIN_ACCEPTANCE_RATE)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        raise ConfigError(f"{FLAG}: min_acceptance_rate must be a number in [0, 1], got {rate!r}")
    common = dict(num_speculative_tokens=k, min_acceptance_rate=float(rate),
                  disable_by_batch_size=DEFAULT_DISABLE_BY_BATCH_SIZE if batch is None else batch)
    if method == "ngram":
        if values.get("model") not in (None, "ngram", "[ngram]"):
            raise ConfigError(f"{FLAG}: method ngram takes no model (got {values['model']!r})")
        most, least = _lookup_lengths(values)
        return SpeculativeConfig("ngram", prompt_lookup_max=most, prompt_lookup_min=least, **common)
    if "prompt_lookup_max" in values or "prompt_lookup_min" in values:
        raise ConfigError(f"{FLAG}: prompt_lookup_max/min apply to method ngram only")
    model = values.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{FLAG}: method draft_model needs model, the draft model's folder")
    return SpeculativeConfig("draft_model", model=model, **common)
