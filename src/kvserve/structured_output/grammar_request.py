"""What a request carries from the input processor to the model runner for its structured output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvserve.structured_output.backend import CompiledGrammar


@dataclass(frozen=True)
class GrammarRequest:
    """A request's compiled constraint and, for a reasoning model, when it starts to apply.

    Attributes:
        compiled: the compiled spec; each choice gets its own matcher (``new_grammar()``).
        reasoning: a ``kvserve.reasoning.ReasoningParser`` when the constraint applies only to
            the answer after the model's ``<think>...</think>`` block, else None.
        closing_alphabet: the tokens a plan to finish within ``max_tokens`` is spelled with
            (``kvserve.structured_output.closing``); empty: no such plan.
    """

    compiled: CompiledGrammar
    reasoning: Any = None
    closing_alphabet: tuple[int, ...] = ()
