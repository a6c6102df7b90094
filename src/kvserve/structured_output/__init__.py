"""Structured outputs: JSON Schema / regex / choice / grammar constraints by token bitmasks.

Pieces (one concept per module):

* :mod:`.config` — :class:`StructuredOutputsConfig`, the engine-level options;
* :mod:`.params` — :class:`StructuredOutputsParams`, the request-side spec (vLLM's fields);
* :mod:`.request_fields` — OpenAI ``response_format``, vLLM ``structured_outputs`` and the older
  ``guided_*`` fields to one spec (pure functions for the input processor);
* :mod:`.backend` — the backend interface and registry (``xgrammar``, ``guidance``, ``auto``);
* :mod:`.compiler` — compiles off the caller's thread with a cache and a deadline;
* :mod:`.bitmask` — the int32 token bitmask and its one batched apply to logits;
* :mod:`.schema_check` — JSON Schema validity and backend-unsupported keywords.
"""

import importlib

_EXPORTS = {
    "CompiledGrammar": "backend",
    "StructuredOutputBackend": "backend",
    "StructuredOutputGrammar": "backend",
    "create_backend": "backend",
    "register_backend": "backend",
    "StructuredOutputsConfig": "config",
    "allocate_token_bitmask": "bitmask",
    "apply_token_bitmask_": "bitmask",
    "GrammarCompileService": "compiler",
    "GrammarCompileTimeout": "errors",
    "StructuredOutputError": "errors",
    "StructuredOutputKind": "params",
    "StructuredOutputsParams": "params",
    "check_request_backend": "request_fields",
    "structured_outputs_from_request": "request_fields",
}


def __getattr__(name: str):
    """Names load their module on first use, so importing ``.config`` or ``.params`` (torch-free,
    for the engine configuration and ``SamplingParams``) does not import torch."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = sorted(_EXPORTS)
