"""Incremental detokenization: turn a request's output token ids into text deltas as they arrive.

Method: the "prefix offset / read offset" window of Hugging Face TGI and vLLM. Tokens do not
decode independently (SentencePiece drops the leading space of the first token of a decode call;
byte-level BPE and byte-fallback tokens can split one UTF-8 character over several tokens), so
each call decodes a short window that starts a few tokens back::

    ids:  ... | ctx ctx ctx | new new |
              ^ prefix      ^ read    ^ end
    prefix_text = decode(ids[prefix:read])     (already emitted)
    new_text    = decode(ids[prefix:end])
    delta       = new_text[len(prefix_text):]

Text is final, and emitted, only up to the last complete character: while the window's text ends
in U+FFFD the tokens are held, and when several tokens arrive at once (speculative decoding, an
emoji spread over many byte tokens) the longest final part is emitted and the rest held. A run of
SentencePiece byte-fallback tokens (``<0xE4><0xBD><0xA0>``) is held until it ends, because the
decoder turns a whole invalid run into U+FFFD, changing earlier bytes' text. Emitted tokens
become the next window's context. Only the window is kept, so a call costs O(window), not
O(all tokens); the window is a few tokens plus the longest incomplete stretch.
"""

from __future__ import annotations

import re
from typing import Any

# Tokens of context decoded in front of the new ones (TGI / vLLM use 5).
_CONTEXT_TOKENS = 5
# A character spans at most 4 bytes, so a complete text never needs more held tokens than this;
# past it the window ends in invalid UTF-8 (or the model wrote U+FFFD itself) and is released.
_MAX_HELD_TOKENS = 16
_REPLACEMENT_CHAR = "\ufffd"
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _special_token_ids(tokenizer: Any) -> frozenset[int]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids = {token_id for token_id, token in decoder.items() if getattr(token, "special", False)}
    return frozenset(ids | set(getattr(tokenizer, "all_special_ids", []) or []))


class IncrementalDetokenizer:
    """Detokenize one request's output incrementally.

    The concatenation of all returned deltas (``add_tokens`` calls, then ``flush``) equals the
    text the output tokens add after the prompt: with an empty prompt exactly
    ``tokenizer.decode(output_ids, skip_special_tokens=...)``; after a prompt, the output is
    decoded in the prompt's context, so a SentencePiece output keeps its first token's leading
    space (``" Paris"``, as vLLM and OpenAI return completions). No delta ends in a broken UTF-8
    character (see the module docstring); after 16 held tokens the text is released anyway, which
    only happens for invalid UTF-8 or a U+FFFD the model really wrote.

    Args:
        tokenizer: a Hugging Face tokenizer (``decode``, ``added_tokens_decoder``).
        prompt_token_ids: the prompt; its last few tokens are the first decode context.
        skip_special_tokens: drop special tokens from the text (they are removed from the window
            up front, which ``decode(..., skip_special_tokens=True)`` does too).
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._skipped_ids = _special_token_ids(tokenizer) if skip_special_tokens else frozenset()
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._byte_fallback = backend is None or "ByteFallback" in str(backend.decoder)
        # The window: ids[:read_offset] were emitted (or are prompt context), the rest are held.
        self._ids: list[int] = self._kept(prompt_token_ids)[-_CONTEXT_TOKENS:]
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)

    def _kept(self, token_ids: list[int]) -> list[int]:
        if not self._skipped_ids:
            return list(token_ids)
        return [t for t in token_ids if t not in self._skipped_ids]

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    @property
    def num_held_tokens(self) -> int:
        """Tokens received whose text is not emitted yet (e.g. an incomplete character)."""
        return len(self._ids) - self._read_offset

    def add_tokens(self, token_ids: list[int]) -> str:
        """Add newly generated tokens; return the text that is now final (may be ``""``).

        Args:
            token_ids: new output token ids, in order.

        Returns:
            The new text. It never ends in a partial UTF-8 character unless more than 16 tokens
            are held (invalid UTF-8, or a U+FFFD the model wrote itself).
        """
        self._ids.extend(self._kept(token_ids))
        held = self.num_held_tokens
        if held == 0:
            return ""
        new_text = self._decode(self._ids)
        if held > _MAX_HELD_TOKENS:
            return self._advance(new_text, len(self._ids))
        if len(new_text) <= len(self._prefix_text):
            return ""
        # Emit up to the last point where the text is final. Several tokens can arrive at once
        # (speculative decoding; emoji spread over many byte tokens), so search backwards.
        for end in range(len(self._ids), self._read_offset, -1):
            text = new_text if end == len(self._ids) else self._decode(self._ids[:end])
            if len(text) <= len(self._prefix_text):
                break
            if not text.endswith(_REPLACEMENT_CHAR) and not self._inside_byte_run(end):
                return self._advance(text, end)
        return ""

    def _inside_byte_run(self, end: int) -> bool:
        """Whether ``end`` may cut a run of SentencePiece byte-fallback tokens (``<0xAB>``).

        The ByteFallback decoder turns a whole run into U+FFFD per byte when the run is not valid
        UTF-8, so a later byte token can change the text of an earlier one (``<0x28>`` reads
        "(" alone but U+FFFD before ``<0xB6>``): text is final only once the run has ended."""
        if not self._byte_fallback or not self._is_byte_token(self._ids[end - 1]):
            return False
        return end == len(self._ids) or self._is_byte_token(self._ids[end])

    def _is_byte_token(self, token_id: int) -> bool:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        return isinstance(piece, str) and _BYTE_FALLBACK.fullmatch(piece) is not None

    def flush(self) -> str:
        """Release held-back text when the request finishes; it ends in U+FFFD only where
        ``tokenizer.decode`` of the whole output would show one too."""
        if self.num_held_tokens == 0:
            return ""
        return self._advance(self._decode(self._ids), len(self._ids))

    def _advance(self, new_text: str, end: int) -> str:
        """Emit ``new_text`` (the decode of ``ids[:end]``) beyond the emitted prefix; the tokens
        just emitted become the next window's context (``prefix_offset = read_offset;
        read_offset = end`` in TGI's terms) and ``ids[end:]`` stay held."""
        delta = new_text[len(self._prefix_text):]
        emitted_from = self._read_offset
        self._ids = self._ids[emitted_from:]
        self._read_offset = end - emitted_from
        self._prefix_text = self._decode(self._ids[:self._read_offset])
        return delta


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet (Radford et al. 2019), inverted: printable bytes stand for
    themselves, the others are shifted to code points 256 and up; maps character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    shifted = [b for b in range(256) if b not in printable]
    mapping = {chr(b): b for b in printable}
    mapping.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return mapping


class TokenDetokenizer:
    """Each token's own text and raw bytes, for logprobs output (OpenAI's ``token`` and ``bytes``).

    - Added tokens (special or not): their content, UTF-8 encoded.
    - SentencePiece byte-fallback pieces ``<0xAB>``: the single byte 0xAB.
    - Byte-level BPE (GPT-2, Llama 3, Qwen, Tekken): the piece mapped back through the byte-level
      alphabet to raw bytes.
    - Other pieces (SentencePiece): ``▁`` becomes a space (kept also at the start: a token's own
      text, unlike ``decode``), UTF-8 encoded.
    - An id the model has but the tokenizer does not (vocabulary padding rows): empty, as vLLM's
      ``convert_ids_list_to_tokens``.

    ``text`` is ``bytes`` decoded as UTF-8 with U+FFFD for a partial character (the exact bytes
    are in ``bytes``). Results are cached per token id.

    Args:
        tokenizer: a Hugging Face tokenizer (``convert_ids_to_tokens``, ``added_tokens_decoder``,
            and for byte-level detection ``backend_tokenizer.decoder``).
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self._added = {token_id: token.content for token_id, token in added.items()}
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._byte_level = backend is not None and "ByteLevel" in str(backend.decoder)
        self._alphabet = _byte_level_alphabet() if self._byte_level else {}
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token_id: int) -> tuple[str, bytes]:
        """Return ``(text, bytes)`` of one token id."""
        if token_id not in self._cache:
            raw = self._token_bytes(token_id)
            self._cache[token_id] = (raw.decode("utf-8", errors="replace"), raw)
        return self._cache[token_id]

    def _token_bytes(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:  # a row the model has beyond the tokenizer's vocabulary (padding): "" as vLLM
            return b""
        fallback = _BYTE_FALLBACK.fullmatch(piece)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        if self._byte_level and all(c in self._alphabet for c in piece):
            return bytes(self._alphabet[c] for c in piece)
        return piece.replace("▁", " ").encode("utf-8")


def detokenize_token(tokenizer: Any, token_id: int) -> tuple[str, bytes]:
    """``(text, bytes)`` of one token (see ``TokenDetokenizer``; build one of those to reuse the
    per-tokenizer set-up and cache across many tokens)."""
    return TokenDetokenizer(tokenizer)(token_id)
