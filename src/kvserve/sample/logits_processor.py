"""The logits-processor interface: per-request state, one batched apply per step.

A logits processor changes the logits of the requests that asked for it before a token is chosen
(``allowed_token_ids``, ``bad_words``, ``min_tokens``, ``logit_bias``; grammars plug in the same
way). It lives in the model runner's persistent batch (``kvserve.model.input_batch``): the batch
tells it when a request takes a row, leaves it, or moves to another row, and each step calls
``apply`` once on the ``[N, V]`` logits of the rows that sample. A processor keeps whatever state
it needs per row (an index tensor, a grammar matcher) and reads a request's tokens from
``RequestView.output_token_ids``, a live list the runner appends to after each sampled token, so
no per-token hook is needed.

Order (``build_logits_processors``), and why:

1. ``structured_outputs``: the grammar's bitmask (``kvserve.structured_output``), a hard
   constraint, applied before the logprobs are taken (``before_logprobs``): vLLM's runner
   masks the logits with the grammar before its sampler, so its ``raw_logprobs`` are the
   grammar's distribution (a disallowed token: ``-inf``, shown as -9999.0).
2. ``allowed_token_ids``: a whitelist; everything else becomes ``-inf``, so later stages only
   ever see allowed tokens.
3. ``bad_words``: bans; a banned token stays banned whatever comes after.
4. ``min_tokens``: bans EOS and ``stop_token_ids`` until enough tokens exist.
5. ``logit_bias``: additive, so it never resurrects a token an earlier stage banned
   (``-inf + bias`` stays ``-inf``).
6. ``structured_outputs_closing``: near the end of ``max_tokens``, a constrained row may take only
   the next token of the shortest way out of its grammar (``kvserve.structured_output.closing``),
   when the stages before left it possible.

Penalties, temperature, top-k/p and min-p follow in the sampler. Logprobs are taken from the
logits after the grammar and before every other processor, as vLLM's default ``raw_logprobs``.

Errors: a processor must not raise for a valid request (the input processor validated it). If
``apply`` raises, the runner retries the step's requests in smaller groups and finishes only the
request it fails on alone (``kvserve.model.runner``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

import torch



class RequestView(Protocol):
    """What a processor may read about a request (``kvserve.model.input_batch.CachedRequestState``):
    its frozen ``spec`` (``EngineRequest``: prompt, sampling parameters, EOS ids, bad words,
    grammar) and its output so far."""

    spec: Any
    output_token_ids: list[int]


class LogitsProcessor(ABC):
    """One kind of logits processing over a batch whose rows are requests.

    Args (of implementations): ``vocab_size`` (``V``) and ``device`` of the logits.
    """

    name: str
    before_logprobs = False  # True: applied before the sampler takes the logprobs (the grammar)

    @abstractmethod
    def add_request(self, row: int, request: RequestView) -> None:
        """``request`` now occupies ``row`` (a free row). Keep state only if it uses this
        processor."""

    @abstractmethod
    def remove_request(self, row: int) -> None:
        """The request in ``row`` left the batch (finished, preempted, or not scheduled)."""

    @abstractmethod
    def move_request(self, src: int, dst: int) -> None:
        """The request in ``src`` moved to the free row ``dst`` (the batch closes gaps)."""

    @abstractmethod
    def is_active(self) -> bool:
        """True when any row uses this processor (``apply`` is skipped otherwise)."""

    @abstractmethod
    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        """Process ``logits`` in place.

        Args:
            logits: float32 ``[N, V]``; row ``i`` belongs to batch row ``rows[i]``.
            rows: the batch rows that sample this step, in logits order.
        """


class RowStateLogitsProcessor(LogitsProcessor):
    """A processor whose state is one entry per row that uses it (``self.rows``): removal, moves
    and ``is_active`` follow from that; subclasses add rows and apply."""

    def __init__(self) -> None:
        self.rows: dict[int, Any] = {}

    def remove_request(self, row: int) -> None:
        self.rows.pop(row, None)

    def move_request(self, src: int, dst: int) -> None:
        if src in self.rows:
            self.rows[dst] = self.rows.pop(src)

    def is_active(self) -> bool:
        return bool(self.rows)


def sampling_rows(own_rows: dict | set, rows: Sequence[int]) -> list[tuple[int, int]]:
    """``(logits row, batch row)`` for each batch row in ``own_rows`` (the rows a processor holds
    state for) that samples now."""
    return [(i, row) for i, row in enumerate(rows) if row in own_rows]


def build_logits_processors(vocab_size: int, device: torch.device, max_rows: int = 256) -> list[LogitsProcessor]:
    """The built-in processors, in the order they run (see the module docstring)."""
    from kvserve.sample.allowed_tokens import AllowedTokenIdsLogitsProcessor
    from kvserve.sample.bad_words import BadWordsLogitsProcessor
    from kvserve.sample.logit_bias import LogitBiasLogitsProcessor
    from kvserve.sample.min_tokens import MinTokensLogitsProcessor
    from kvserve.structured_output.logits_processor import GrammarClosingLogitsProcessor, GrammarLogitsProcessor

    grammar = GrammarLogitsProcessor(vocab_size, device, max_rows)
    return [
        grammar,
        AllowedTokenIdsLogitsProcessor(vocab_size, device),
        BadWordsLogitsProcessor(vocab_size, device),
        MinTokensLogitsProcessor(vocab_size, device),
        LogitBiasLogitsProcessor(vocab_size, device),
        GrammarClosingLogitsProcessor(grammar),
    ]


def ban(logits: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
    """Set ``logits[row, token] = -inf`` for each ``(row, token)`` pair."""
    if not pairs:
        return
    rows, tokens = zip(*pairs)
    index = (torch.tensor(rows, dtype=torch.int64, device=logits.device),
             torch.tensor(tokens, dtype=torch.int64, device=logits.device))
    logits.index_put_(index, torch.tensor(float("-inf"), device=logits.device))
