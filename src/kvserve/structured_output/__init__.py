"""Structured outputs: JSON Schema / regex / choice / grammar constraints by token bitmasks.

Pieces (one concept per module):

* :mod:`.params` — :class:`StructuredOutputsParams`, the request-side spec (vLLM's fields);
* :mod:`.request_fields` — OpenAI ``response_format``, vLLM ``structured_outputs`` and the older
  ``guided_*`` fields to one spec (pure functions for the input processor);
* :mod:`.backend` — the backend interface and registry (``xgrammar``, ``guidance``, ``auto``);
* :mod:`.compiler` — compiles off the caller's thread with a cache and a deadline;
* :mod:`.bitmask` — the int32 token bitmask and its one batched apply to logits;
* :mod:`.schema_check` — JSON Schema validity and backend-unsupported keywords.
"""

from kvserve.structured_output.backend import (
    CompiledGrammar,
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputsConfig,
    create_backend,
    register_backend,
)
from kvserve.structured_output.bitmask import allocate_token_bitmask, apply_token_bitmask_
from kvserve.structured_output.compiler import GrammarCompileService
from kvserve.structured_output.errors import GrammarCompileTimeout, StructuredOutputError
from kvserve.structured_output.params import StructuredOutputKind, StructuredOutputsParams
from kvserve.structured_output.request_fields import (
    check_request_backend,
    structured_outputs_from_request,
)

__all__ = [
    "CompiledGrammar",
    "GrammarCompileService",
    "GrammarCompileTimeout",
    "StructuredOutputBackend",
    "StructuredOutputError",
    "StructuredOutputGrammar",
    "StructuredOutputKind",
    "StructuredOutputsConfig",
    "StructuredOutputsParams",
    "allocate_token_bitmask",
    "apply_token_bitmask_",
    "check_request_backend",
    "create_backend",
    "register_backend",
    "structured_outputs_from_request",
]
