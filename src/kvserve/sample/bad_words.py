"""``bad_words`` (vLLM's extension): words a request never generates.

Tokenization, once per request (:func:`tokenize_bad_words`, called by the input processor): each
word is encoded without special tokens as written (leading spaces removed) and again with one
leading space; the second sequence is kept only when it starts with a different token and has
the same length (in BPE vocabularies `` word`` is usually a token of its own). A word therefore
gives one or two token sequences.

Ban, every step (:func:`banned_token_ids`, applied by :class:`BadWordsLogitsProcessor`): for each sequence ``[t1 .. tk]`` the last token
``tk`` gets ``-inf`` when the request's *generated* tokens end with ``[t1 .. tk-1]``; a one-token
sequence is always banned. The prompt does not count. So the sequence is never completed::

    bad word "big dog" -> [big][ dog] (and [ big][ dog])
    generated ... [the][ big]  ->  logit of [ dog] = -inf;  [ cat] is still allowed

The same text spelled by other tokens (``[b][ig]``) is not caught, as in vLLM (whose
``SamplingParams.update_from_tokenizer`` and ``v1/sample/ops/bad_words.py`` define these rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvserve.errors import InvalidRequestError
from kvserve.sample.logits_processor import RowStateLogitsProcessor, RequestView, ban, sampling_rows
from kvserve.tokenizer import require_valid_unicode


def tokenize_bad_words(tokenizer: Any, bad_words: list[str], vocab_size: int) -> list[list[int]]:
    """Token-id sequences of ``bad_words`` (see the module docstring), in word order.

    Raises:
        InvalidRequestError: a word that is not valid Unicode (a lone surrogate), that encodes
            to no token, or to an id outside the model's vocabulary (``param="bad_words"``).
    """
    sequences: list[list[int]] = []
    for word in bad_words:
        require_valid_unicode(word, "bad_words")
        plain = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not plain:
            raise InvalidRequestError(f"bad word {word!r} encodes to no token", param="bad_words")
        sequences.append(plain)
        spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            sequences.append(spaced)
    for sequence in sequences:
        for token_id in sequence:
            if not 0 <= token_id < vocab_size:
                raise InvalidRequestError(
                    f"a bad word encodes to token id {token_id}, outside the model's vocabulary "
                    f"(0..{vocab_size - 1})", param="bad_words")
    return sequences


def banned_token_ids(sequences: list[list[int]], output_token_ids: list[int]) -> list[int]:
    """The tokens to ban at the next step: the last token of each sequence whose other tokens
    are the end of ``output_token_ids`` (a one-token sequence always). Sorted, no repeats."""
    banned = set()
    num_output = len(output_token_ids)
    for sequence in sequences:
        prefix_len = len(sequence) - 1
        if prefix_len == 0 or (prefix_len <= num_output and output_token_ids[num_output - prefix_len:] == sequence[:-1]):
            banned.add(sequence[-1])
    return sorted(banned)


class BadWordsLogitsProcessor(RowStateLogitsProcessor):
    """Keeps, per row with bad words, its token-id sequences and its live output list."""

    name = "bad_words"

    def __init__(self, vocab_size: int, device: torch.device):
        super().__init__()

    def add_request(self, row: int, request: RequestView) -> None:
        if request.spec.bad_words_token_ids:
            self.rows[row] = (request.spec.bad_words_token_ids, request.output_token_ids)

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        ban(logits, [(i, t) for i, row in sampling_rows(self.rows, rows)
                     for t in banned_token_ids(*self.rows[row])])
