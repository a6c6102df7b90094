"""``logit_bias`` (OpenAI): a bias added to the logits of chosen tokens, in [-100, 100].

Applied last among the logits processors (``kvserve.sample.logits_processor``), so a bias never
lifts a token another processor banned: ``-inf + bias`` stays ``-inf``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvserve.sample.logits_processor import RowStateLogitsProcessor, RequestView, sampling_rows


class LogitBiasLogitsProcessor(RowStateLogitsProcessor):
    """Keeps, per row with a ``logit_bias``, its token ids and biases."""

    name = "logit_bias"

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__()
        self.device = device

    def add_request(self, row: int, request: RequestView) -> None:
        bias = request.spec.sampling_params.logit_bias
        if bias:
            self.rows[row] = (list(bias), [float(v) for v in bias.values()])

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        logits_rows, token_ids, values = [], [], []
        for i, row in sampling_rows(self.rows, rows):
            ids, biases = self.rows[row]
            logits_rows.extend([i] * len(ids))
            token_ids.extend(ids)
            values.extend(biases)
        if not logits_rows:
            return
        index = (torch.tensor(logits_rows, dtype=torch.int64, device=logits.device),
                 torch.tensor(token_ids, dtype=torch.int64, device=logits.device))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=logits.device), accumulate=True)
