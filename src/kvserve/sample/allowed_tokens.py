"""``allowed_token_ids`` (vLLM's extension): a request may generate only the listed token ids.

Every other logit of the row becomes ``-inf`` before any other stage (see
``kvserve.sample.logits_processor`` for the order), so a greedy row takes the argmax over the
allowed ids and a random row draws only from them. Logprobs stay those of the raw model.

    row's logits   [ 2.1  0.3  5.0 -1.2  0.9 ]      allowed_token_ids = [1, 4]
    after the mask [-inf  0.3 -inf -inf  0.9 ]  ->  greedy picks 4
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvserve.sample.logits_processor import RowStateLogitsProcessor, RequestView, sampling_rows


class AllowedTokenIdsLogitsProcessor(RowStateLogitsProcessor):
    """Keeps, per row that sets ``allowed_token_ids``, a bool ``[V]`` mask of what it allows."""

    name = "allowed_token_ids"

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__()
        self.vocab_size = vocab_size
        self.device = device

    def add_request(self, row: int, request: RequestView) -> None:
        allowed = request.spec.sampling_params.allowed_token_ids
        if allowed is None:
            return
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[torch.tensor(allowed, dtype=torch.int64)] = True  # ids checked by the input processor
        self.rows[row] = mask.to(self.device)

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        pairs = sampling_rows(self.rows, rows)
        if not pairs:
            return
        allowed = torch.stack([self.rows[row] for _, row in pairs])
        if len(pairs) == logits.shape[0]:  # every row restricts: no gather/scatter
            logits.masked_fill_(~allowed, float("-inf"))
            return
        index = torch.tensor([i for i, _ in pairs], dtype=torch.int64, device=logits.device)
        selected = logits[index]
        selected.masked_fill_(~allowed, float("-inf"))
        logits[index] = selected
