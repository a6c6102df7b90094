"""Structured outputs as a logits processor: per row a grammar matcher, per step one batched
bitmask apply (see ``kvserve.sample.logits_processor`` for the interface and the order).

Each row's matcher catches up with the request's output at the start of ``apply`` (the runner
appends sampled tokens to the live ``output_token_ids`` list), so no per-token hook is needed;
a request that re-enters the batch after preemption gets a fresh matcher that replays its
output. For a reasoning model the row is left unconstrained until its ``</think>`` (the
reasoning parser says when), then the matcher is fed the tokens after it. Near the end of its
``max_tokens`` a row is steered to the shortest way out of its grammar (``closing``): this
processor finds the token, :class:`GrammarClosingLogitsProcessor` forces it after the logprobs
were taken (they stay the grammar-masked model's)::

    apply(logits [N, V], rows):
        for each row with a grammar that samples now:
            reasoning not over yet?  -> skip (no mask)
            feed output[fed:] to the matcher (a token it refuses fails the request)
            fill bitmask[i] with the allowed next tokens (EOS only where the grammar may end)
            few tokens left?  -> closing[row] = the next token of the way out
        apply_token_bitmask_(logits, bitmask[:N], indices, ops)   # one batched op

A token the matcher refuses can only come from a bug or a race; ``apply`` raises, and the runner
finishes that request alone (``kvserve.model.runner``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvserve.kernels.triton_sample import sample_ops_for
from kvserve.sample.logits_processor import LogitsProcessor, RequestView, RowStateLogitsProcessor, sampling_rows
from kvserve.structured_output.backend import StructuredOutputGrammar
from kvserve.structured_output.bitmask import apply_token_bitmask_, bitmask_width
from kvserve.structured_output.closing import LOOKAHEAD, closing_token


class GrammarViolation(RuntimeError):
    """A sampled token the request's grammar does not allow."""


@dataclass
class _Row:
    matcher: StructuredOutputGrammar
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # live
    reasoning: Any  # ReasoningParser or None
    reasoning_ended: bool
    fed: int = 0  # output tokens the matcher has seen (when reasoning ended: tokens before it)
    content_start: int = 0  # output tokens before the constrained content (the reasoning)
    ends_at_eos: bool = True  # the grammar's EOS finishes the request (not ignore_eos)
    max_tokens: int = 0
    min_tokens: int = 0
    closing_alphabet: tuple[int, ...] = ()
    stop_token_ids: tuple[int, ...] = ()


class GrammarLogitsProcessor(RowStateLogitsProcessor):
    """Masks each constrained row to the tokens its grammar allows next."""

    name = "structured_outputs"
    before_logprobs = True  # vLLM masks with the grammar before its sampler takes raw logprobs

    def __init__(self, vocab_size: int, device: torch.device, max_rows: int = 256):
        super().__init__()
        self.vocab_size = vocab_size
        self.device = device
        self.ops = sample_ops_for(device)
        self._bitmask = torch.full((max_rows, bitmask_width(vocab_size)), -1, dtype=torch.int32)
        self.closing: dict[int, int] = {}  # batch row -> the token it must take now (this step)

    def add_request(self, row: int, request: RequestView) -> None:
        spec = request.spec
        if spec.grammar is None:
            return
        reasoning = spec.grammar.reasoning
        ended = reasoning is None or reasoning.is_reasoning_end(spec.prompt_token_ids)
        params = spec.sampling_params
        self.rows[row] = _Row(spec.grammar.compiled.new_grammar(), spec.prompt_token_ids, request.output_token_ids,
                              reasoning, ended, ends_at_eos=not params.ignore_eos, max_tokens=params.max_tokens,
                              min_tokens=params.min_tokens, closing_alphabet=spec.grammar.closing_alphabet,
                              stop_token_ids=tuple(sorted(spec.eos_token_ids)))

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        self.closing = {}
        single = len(set(rows)) == len(rows)  # one position per request (not verifying drafts)
        constrained = [(i, self.rows[row]) for i, row in sampling_rows(self.rows, rows)]
        # A matcher terminated by an EOS that finishes the request (an accepted draft token of
        # speculative decoding: positions after it are still verified) leaves the row
        # unconstrained: the scheduler drops every token after that EOS. Without speculation such
        # a row never samples again.
        constrained = [(i, state) for i, state in constrained
                       if self._catch_up(state) and not (state.ends_at_eos and state.matcher.is_terminated())]
        if not constrained:
            return
        if logits.shape[0] > self._bitmask.shape[0]:
            self._bitmask = torch.full((logits.shape[0], self._bitmask.shape[1]), -1, dtype=torch.int32)
        for i, state in constrained:
            state.matcher.fill_bitmask(self._bitmask, i)
            token = self._closing_token(state) if single else None
            if token is not None:
                self.closing[rows[i]] = token
        apply_token_bitmask_(logits, self._bitmask[: logits.shape[0]], [i for i, _ in constrained], self.ops)

    @staticmethod
    def _closing_token(state: _Row) -> int | None:
        """The next token of the way out of the grammar once the rest of ``max_tokens`` needs it
        (``closing.closing_token``); else None."""
        remaining = state.max_tokens - len(state.output_token_ids)
        if (not state.closing_alphabet or not state.ends_at_eos or remaining > LOOKAHEAD
                or len(state.output_token_ids) < state.min_tokens):
            return None
        return closing_token(state.matcher, state.closing_alphabet, state.stop_token_ids, remaining)

    @staticmethod
    def _catch_up(state: _Row) -> bool:
        """Feed the matcher the output it has not seen; False while the reasoning goes on.

        Raises:
            GrammarViolation: the matcher refuses a token.
        """
        output = state.output_token_ids
        if len(output) < state.fed:
            GrammarLogitsProcessor._roll_back(state, len(output))
        if not state.reasoning_ended:
            if not state.reasoning.is_reasoning_end(state.prompt_token_ids + output):
                return False
            state.reasoning_ended = True
            content = state.reasoning.content_token_ids(output)
            state.fed = state.content_start = len(output) - len(content)
        new = output[state.fed:]
        if new and not state.matcher.accept_tokens(new):
            raise GrammarViolation(f"a sampled token ({new}) breaks the request's structured-output grammar")
        state.fed = len(output)
        return True

    @staticmethod
    def _roll_back(state: _Row, num_output: int) -> None:
        """The output shrank to ``num_output`` tokens (a speculative verification that failed took
        its accepted drafts back): undo the matcher's last tokens, or start over when the output
        now ends inside the reasoning."""
        if state.reasoning is not None and num_output < state.content_start:
            state.matcher.reset()
            state.fed = state.content_start = 0
            state.reasoning_ended = False
            return
        state.matcher.rollback(state.fed - num_output)
        state.fed = num_output


class GrammarClosingLogitsProcessor(LogitsProcessor):
    """Forces the token :class:`GrammarLogitsProcessor` chose for a row near the end of its
    ``max_tokens`` (its ``closing``), after the logprobs were taken; last of the processors, and
    only where an earlier one left that token possible.

    Args:
        grammar: the step's grammar processor (run before this one in the same step).
    """

    name = "structured_outputs_closing"

    def __init__(self, grammar: GrammarLogitsProcessor):
        self.grammar = grammar

    def add_request(self, row: int, request: RequestView) -> None:
        pass  # the grammar processor holds the rows

    def remove_request(self, row: int) -> None:
        pass

    def move_request(self, src: int, dst: int) -> None:
        pass

    def is_active(self) -> bool:
        return self.grammar.is_active()

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        if not self.grammar.closing:
            return  # the common case: no row is near the end of its budget
        for i, row in enumerate(rows):
            token = self.grammar.closing.get(row)
            if token is not None and torch.isfinite(logits[i, token]):
                kept = logits[i, token].clone()
                logits[i].fill_(float("-inf"))
                logits[i, token] = kept
