"""``min_tokens``: EOS and ``stop_token_ids`` cannot be generated before a request has this many
output tokens, as vLLM's ``MinTokensLogitsProcessor`` (which bans ``all_stop_token_ids``: EOS
too under ``ignore_eos``).

The stop-string check waits for ``min_tokens`` too; that is the front end's (see
``kvserve.engine.output_processor``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvserve.sample.logits_processor import LogitsProcessor, RequestView, ban, sampling_rows


class MinTokensLogitsProcessor(LogitsProcessor):
    """Keeps, per row below its ``min_tokens``, the live output list, the minimum and the banned
    ids; a row past its minimum is dropped at the next ``apply``."""

    name = "min_tokens"

    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.rows: dict[int, tuple[list[int], int, list[int]]] = {}

    def add_request(self, row: int, request: RequestView) -> None:
        params = request.sampling_params
        if len(request.output_token_ids) >= params.min_tokens:
            return
        banned = set(params.stop_token_ids) | set(request.eos_token_ids)
        banned_ids = sorted(t for t in banned if 0 <= t < self.vocab_size)
        if banned_ids:
            self.rows[row] = (request.output_token_ids, params.min_tokens, banned_ids)

    def remove_request(self, row: int) -> None:
        self.rows.pop(row, None)

    def move_request(self, src: int, dst: int) -> None:
        if src in self.rows:
            self.rows[dst] = self.rows.pop(src)

    def is_active(self) -> bool:
        return bool(self.rows)

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        for row in [row for row, (output, least, _) in self.rows.items() if len(output) >= least]:
            del self.rows[row]
        ban(logits, [(i, t) for i, row in sampling_rows(self.rows, rows) for t in self.rows[row][2]])
