"""Tokenizer calls the HTTP layer makes: prompts, chat templates, and per-token strings/bytes.

The chat-template and token-string helpers are owned by other modules
(``kvserve.tokenizer.apply_chat_template``, ``kvserve.engine.detokenizer.detokenize_token``);
they are looked up at call time and a plain Hugging Face fallback is used while they are absent.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

from kvserve.errors import InvalidRequestError


def tokenize_prompt(tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Token ids of ``text`` (no chat template).

    Raises:
        InvalidRequestError: the text tokenizes to nothing.
    """
    token_ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    if not token_ids:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    return token_ids


def render_chat(tokenizer: Any, messages: list[dict], *, add_generation_prompt: bool,
                continue_final_message: bool, chat_template: str | None) -> list[int]:
    """Prompt token ids of a conversation rendered with the chat template.

    Raises:
        InvalidRequestError: the template fails on these messages (its error is quoted) or the
            tokenizer has no template and none was given.
    """
    try:
        from kvserve.tokenizer import apply_chat_template
    except ImportError:
        apply_chat_template = _hf_apply_chat_template
    return list(apply_chat_template(tokenizer, messages, add_generation_prompt=add_generation_prompt,
                                    continue_final_message=continue_final_message,
                                    chat_template=chat_template))


def _hf_apply_chat_template(tokenizer: Any, messages: list[dict], *, add_generation_prompt: bool,
                            continue_final_message: bool, chat_template: str | None) -> list[int]:
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError("this model's tokenizer has no chat template; start the server "
                                  "with --chat-template or use /v1/completions", param="messages")
    try:
        encoded = tokenizer.apply_chat_template(
            messages, chat_template=chat_template, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tokenize=True, return_dict=False)
    except Exception as exc:  # jinja2 errors, raise_exception() in templates, ValueError
        raise InvalidRequestError(f"chat template failed on these messages: {exc}", param="messages") from exc
    return list(encoded)


TokenText = Callable[[int], tuple[str, bytes]]


def make_token_text(tokenizer: Any) -> TokenText:
    """A function ``token_id -> (text, raw UTF-8 bytes)`` of one token, for logprobs (bytes may
    be a partial character; text then has U+FFFD). Build once per server: it caches per token.
    Uses ``kvserve.engine.detokenizer.TokenDetokenizer`` where present."""
    try:
        from kvserve.engine.detokenizer import TokenDetokenizer
    except ImportError:
        return lambda token_id: _fallback_token_text(tokenizer, token_id)
    return TokenDetokenizer(tokenizer)


def _fallback_token_text(tokenizer: Any, token_id: int) -> tuple[str, bytes]:
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if piece is None:
        return "", b""
    byte_decoder = _byte_level_decoder()
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # SentencePiece byte
        raw = bytes([int(piece[3:5], 16)])
    elif all(char in byte_decoder for char in piece) and "▁" not in piece:  # GPT-2 byte level
        raw = bytes(byte_decoder[char] for char in piece)
    else:
        raw = piece.replace("▁", " ").encode("utf-8")
    return raw.decode("utf-8", errors="replace"), raw


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes-to-unicode table (Radford et al. 2019, ``encoder.py``)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars)}
