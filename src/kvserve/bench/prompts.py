"""Prompt text of an exact token length under the target model's tokenizer.

Decoding random token ids and encoding the text again rarely gives the same ids back (byte-level
pieces merge, broken UTF-8 becomes U+FFFD), so the length drifts. The fix, as in vLLM's random
dataset: re-encode, cut or pad with fresh random ids, decode, and repeat until
``len(encode(prefix + text)) == len(encode(prefix)) + n`` and the prefix's ids are unchanged.
Lengths count tokens without special tokens (``add_special_tokens=False``); a server whose
tokenizer adds BOS sees one more.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvserve.errors import InvalidRequestError

MAX_ADJUST_STEPS = 64
MAX_RESTARTS = 16


def load_tokenizer(path: str, trust_remote_code: bool = False, use_fast: bool = True) -> Any:
    """A ``transformers.AutoTokenizer`` from a local folder (no network); ``trust_remote_code``
    and ``use_fast=False`` as vLLM's ``--trust-remote-code`` and ``--tokenizer-mode slow``.

    Raises:
        InvalidRequestError: the folder does not hold a loadable tokenizer.
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code,
                                             use_fast=use_fast)
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(
            f"cannot load a tokenizer from {path!r} ({exc}); --tokenizer must be a local folder "
            "with tokenizer files (tokenizer.json or tokenizer.model and tokenizer_config.json)",
            param="tokenizer",
        ) from exc


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def sampleable_ids(tokenizer: Any) -> np.ndarray:
    """Ids random prompts draw from: the whole vocabulary except special tokens (int64)."""
    special = set(tokenizer.all_special_ids or [])
    ids = np.array([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)
    if len(ids) == 0:
        raise InvalidRequestError("the tokenizer has no non-special tokens to build prompts from", "tokenizer")
    return ids


class ExactLengthPrompter:
    """Builds texts of exact token lengths with one tokenizer and one seeded generator.

    Args:
        tokenizer: a Hugging Face tokenizer.
        rng: ``numpy.random.Generator``; the texts depend only on its state.
    """

    def __init__(self, tokenizer: Any, rng: np.random.Generator):
        self.tokenizer = tokenizer
        self.rng = rng
        self._ids = sampleable_ids(tokenizer)

    def _random_ids(self, n: int) -> list[int]:
        return self.rng.choice(self._ids, size=n).tolist()

    def text(self, num_tokens: int, prefix: str = "") -> tuple[str, list[int]]:
        """A text ``t`` with ``encode(prefix + t) == encode(prefix) + ids``, ``len(ids) == num_tokens``.

        Returns:
            ``(t, ids)``: the text and its ``num_tokens`` token ids.

        Raises:
            InvalidRequestError: ``num_tokens`` < 0, or no such text was found (a tokenizer whose
                decode/encode never round-trips to that length).
        """
        if num_tokens < 0:
            raise InvalidRequestError(f"token length must be >= 0, got {num_tokens}", "input_len")
        if num_tokens == 0:
            return "", []
        prefix_ids = encode(self.tokenizer, prefix)
        for _ in range(MAX_RESTARTS):
            found = self._adjust(self._random_ids(num_tokens), num_tokens, prefix, prefix_ids)
            if found is not None:
                return found
        raise InvalidRequestError(
            f"could not build a prompt of exactly {num_tokens} tokens with this tokenizer after "
            f"{MAX_RESTARTS} restarts; try another length",
            param="input_len",
        )

    def _adjust(
        self, ids: list[int], n: int, prefix: str, prefix_ids: list[int]
    ) -> tuple[str, list[int]] | None:
        k = len(prefix_ids)
        for _ in range(MAX_ADJUST_STEPS):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            full = encode(self.tokenizer, prefix + text)
            if full[:k] != prefix_ids:
                return None  # the text merged into the prefix's last token: restart
            got = full[k:]
            if len(got) == n:
                return text, got
            ids = got[:n] if len(got) > n else got + self._random_ids(n - len(got))
        return None
