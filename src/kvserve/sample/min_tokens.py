"""``min_tokens``: EOS and ``stop_token_ids`` cannot be generated before a request has this many
output tokens, as vLLM's ``MinTokensLogitsProcessor`` (which bans ``all_stop_token_ids``: EOS
too under ``ignore_eos``).

The stop-string check waits for ``min_tokens`` too; that is the front end's (see
``kvserve.engine.output_processor``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvserve.sample.logits_processor import RowStateLogitsProcessor, RequestView, ban, sampling_rows


class MinTokensLogitsProcessor(RowStateLogitsProcessor):
    """Keeps, per row below its ``min_tokens`` when it entered the batch, the live output list,
    the minimum and the banned ids; ``apply`` bans them only while the output is shorter (an
    output can shrink again: a speculative verification that failed takes its accepted drafts
    back)."""

    name = "min_tokens"

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__()
        self.vocab_size = vocab_size

    def add_request(self, row: int, request: RequestView) -> None:
        params = request.spec.sampling_params
        if len(request.output_token_ids) >= params.min_tokens:
            return
        banned = set(params.stop_token_ids) | set(request.spec.eos_token_ids)
        banned_ids = sorted(t for t in banned if 0 <= t < self.vocab_size)
        if banned_ids:
            self.rows[row] = (request.output_token_ids, params.min_tokens, banned_ids)

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        ban(logits, [(i, t) for i, row in sampling_rows(self.rows, rows)
                     if len(self.rows[row][0]) < self.rows[row][1] for t in self.rows[row][2]])
