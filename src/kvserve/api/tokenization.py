"""Tokenizer calls the HTTP layer makes: prompts, chat templates, and per-token strings/bytes.

Chat templates come from ``kvserve.tokenizer``, token strings and bytes from
``kvserve.engine.detokenizer``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvserve.engine.detokenizer import TokenDetokenizer
from kvserve.errors import InvalidRequestError
from kvserve.tokenizer import apply_chat_template, require_valid_unicode


def tokenize_prompt(tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Token ids of ``text`` (no chat template).

    Raises:
        InvalidRequestError: the text is not valid Unicode (a lone surrogate) or tokenizes to
            nothing.
    """
    require_valid_unicode(text, "prompt")
    token_ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    if not token_ids:
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    return token_ids


def render_chat(tokenizer: Any, messages: list[dict], *, add_generation_prompt: bool,
                continue_final_message: bool, chat_template: str | None,
                tools: list[dict] | None = None, chat_template_kwargs: dict | None = None,
                add_special_tokens: bool = False) -> list[int]:
    """Prompt token ids of a conversation rendered with the chat template (``tools``: OpenAI
    function tools the template may show the model; ``chat_template_kwargs``: extra template
    variables, e.g. Qwen3's ``enable_thinking``).

    Raises:
        InvalidRequestError: the template fails on these messages (its error is quoted), the
            tokenizer has no template and none was given, or the text is not valid Unicode.
    """
    return list(apply_chat_template(tokenizer, messages, add_generation_prompt=add_generation_prompt,
                                    continue_final_message=continue_final_message,
                                    chat_template=chat_template, tools=tools,
                                    chat_template_kwargs=chat_template_kwargs,
                                    add_special_tokens=add_special_tokens))


TokenText = Callable[[int], tuple[str, bytes]]


def make_token_text(tokenizer: Any) -> TokenText:
    """A function ``token_id -> (text, raw UTF-8 bytes)`` of one token, for logprobs (bytes may
    be a partial character; text then has U+FFFD). Build once per server: it caches per token."""
    return TokenDetokenizer(tokenizer)


def token_id_text(token_id: int) -> tuple[str, bytes]:
    """``("token_id:<id>", its bytes)``: how logprobs name tokens when a request sets vLLM's
    ``return_tokens_as_token_ids`` (so that tokens that are not valid UTF-8 alone can be told
    apart)."""
    text = f"token_id:{token_id}"
    return text, text.encode()
