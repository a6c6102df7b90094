"""The grammar-backend extension point: per-model backend, compiled grammars, request matchers.

Shapes follow vLLM v1's ``vllm/v1/structured_output/backend_types.py``::

    StructuredOutputBackend (one per model, built once: tokenizer info, compiler)
        .compile(params) -> CompiledGrammar         slow (ms), thread-safe, cacheable
    CompiledGrammar (one per distinct spec, shared)
        .new_grammar() -> StructuredOutputGrammar    cheap (µs)
    StructuredOutputGrammar (one per request/choice: matcher state)
        accept_tokens / validate_tokens / rollback / fill_bitmask / is_terminated / reset

Token bitmask layout (both libraries agree): ``int32 [B, ceil(V/32)]``; bit ``j`` of word ``k``
of row ``b`` allows token ``32*k + j`` (two's-complement words, little-endian bit order).
``V`` is the model's vocabulary (logits width), which may exceed the tokenizer's: padding
rows are never allowed. EOS (the model's stop tokens) is allowed only where the grammar can end.

Interface notes for the lead:

* Build one backend per model at engine start with :func:`create_backend`; hand
  ``stop_token_ids`` = the model's EOS ids (generation config), ``vocab_size`` = logits width.
* Compile through :class:`kvserve.structured_output.compiler.GrammarCompileService` (off the
  engine thread, cached, with a deadline); give each request (each of ``n`` choices) its own
  ``compiled.new_grammar()``.
* Per step, for the rows with a grammar (after reasoning ended): ``backend.fill_bitmasks(rows,
  bitmask)`` then :func:`kvserve.structured_output.bitmask.apply_token_bitmask_` on the float32
  logits; after sampling ``grammar.accept_tokens([token])``. A ``False`` from ``accept_tokens``
  means the sampled token broke the grammar (a bug or a race): finish that request with an error.
  Preemption by recompute: ``grammar.reset()`` then re-accept the output tokens, or
  ``rollback(n)`` (needs ``max_rollback_tokens``).
* A finished grammar (``is_terminated()``) leaves only EOS allowed: stop the request there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch

from kvserve.registry import Registry
from kvserve.structured_output.config import BACKEND_CHOICES, StructuredOutputsConfig  # noqa: F401
from kvserve.structured_output.errors import StructuredOutputError
from kvserve.structured_output.params import StructuredOutputsParams



class StructuredOutputGrammar(ABC):
    """Per-request matcher: where one output stands in its grammar.

    Holds the backend's matcher, the count of tokens accepted and whether a stop token ended the
    output; the backends implement the four operations over their matcher.
    """

    def __init__(self, matcher: Any):
        self._matcher = matcher
        self._count = 0
        self._terminated = False

    @abstractmethod
    def accept_tokens(self, tokens: Sequence[int]) -> bool:
        """Advance over ``tokens``; ``False`` (state unchanged past the bad token) if one is not
        allowed. Tokens after termination (e.g. after EOS) are ignored and return ``True``."""

    @abstractmethod
    def validate_tokens(self, tokens: Sequence[int]) -> list[int]:
        """The longest accepted prefix of ``tokens``, without advancing (draft verification)."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (at most ``max_rollback_tokens``)."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (int32 CPU tensor [B, W])."""

    def is_terminated(self) -> bool:
        """Whether the grammar accepted a stop token (the output is complete)."""
        return self._terminated

    def reset(self) -> None:
        """Back to the start state (before any token)."""
        self._matcher.reset()
        self._count = 0
        self._terminated = False

    @property
    def num_processed_tokens(self) -> int:
        """Tokens accepted so far (after rollbacks)."""
        return self._count


class CompiledGrammar(ABC):
    """A compiled spec, shared by every request with the same spec; immutable."""

    @abstractmethod
    def new_grammar(self) -> StructuredOutputGrammar:
        """A fresh matcher at the start state."""


class StructuredOutputBackend(ABC):
    """A grammar library bound to one model's tokenizer and vocabulary.

    Args:
        tokenizer: the model's Hugging Face (fast) tokenizer.
        vocab_size: logits width; the bitmask covers ``max(vocab_size, len(tokenizer))``.
        stop_token_ids: ids that end generation (allowed only where the grammar may end).
        config: engine-level options.
    """

    name: str = ""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 config: StructuredOutputsConfig):
        self.tokenizer = tokenizer
        self.vocab_size = max(int(vocab_size), len(tokenizer))
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        self.config = config

    @abstractmethod
    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """Compile ``params`` (slow: call off the engine thread, see the compile service).

        Raises:
            StructuredOutputError: the backend rejects the spec (message names the problem).
        """

    def spec_text(self, params: StructuredOutputsParams) -> str:
        """The spec as the backend compiles it.

        Raises:
            StructuredOutputError: it is longer than ``config.max_spec_bytes``.
        """
        text = params.spec_text()
        if len(text.encode()) > self.config.max_spec_bytes:
            raise StructuredOutputError(
                f"{params.source}: the spec has {len(text.encode())} bytes; the limit is "
                f"{self.config.max_spec_bytes}",
                param=params.source,
            )
        return text

    def allocate_token_bitmask(self, batch_size: int) -> torch.Tensor:
        """An all-allowed int32 bitmask ``[batch_size, ceil(V/32)]`` on CPU."""
        from kvserve.structured_output.bitmask import allocate_token_bitmask

        return allocate_token_bitmask(batch_size, self.vocab_size)

    def fill_bitmasks(self, rows: Sequence[tuple[StructuredOutputGrammar, int]],
                      bitmask: torch.Tensor) -> None:
        """Fill ``bitmask[row]`` for each ``(grammar, row)``; backends may do it in parallel."""
        for grammar, row in rows:
            grammar.fill_bitmask(bitmask, row)


_BACKENDS: Registry[type[StructuredOutputBackend]] = Registry("structured outputs backend",
                                                             "kvserve.structured_output.backend_auto")
register_backend = _BACKENDS.register  # class decorator


def create_backend(tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                   config: StructuredOutputsConfig | None = None) -> StructuredOutputBackend:
    """The backend ``config.backend`` for one model (builds its tokenizer info: ~1-3 s).

    Raises:
        ValueError: an unknown backend name (a configuration error at start).
    """
    from kvserve.structured_output.bitmask import warm_up_apply

    config = config or StructuredOutputsConfig()
    backend = _BACKENDS.get(config.backend)
    warm_up_apply()  # imports xgrammar's kernel now (~4 s), not on the first engine step
    return backend(tokenizer, vocab_size, stop_token_ids, config)
