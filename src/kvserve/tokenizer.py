"""Tokenizer loading, chat templates and end-of-sequence ids.

The tokenizer is the Hugging Face one (``transformers.AutoTokenizer``); this module adds what
the engine needs around it: typed errors for missing files and failing templates, a chat
template override, and the union of the end-of-sequence ids a checkpoint declares.

Chat templates render in transformers' sandboxed Jinja environment
(``jinja2.sandbox.ImmutableSandboxedEnvironment``), as in vLLM and Hugging Face TGI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvserve.errors import CheckpointError, InvalidRequestError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tekken.json")

# Class names that load tokenizer.json as written (transformers 5 renamed the fast base class).
_GENERIC_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}


def load_tokenizer(model_dir: str | Path, chat_template: str | None = None) -> Any:
    """Load the Hugging Face tokenizer of a model folder.

    Reads ``tokenizer.json`` (with ``tokenizer_config.json`` and ``chat_template.jinja``), or a
    SentencePiece ``tokenizer.model``, through ``AutoTokenizer``; a folder with only a Mistral
    ``tekken.json`` is converted with transformers' Tekken converter. A ``tokenizer.json``
    whose ``tokenizer_config.json`` declares the generic class (``TokenizersBackend`` /
    ``PreTrainedTokenizerFast``) is loaded as written; when ``AutoTokenizer`` substitutes a class
    other than the declared one (transformers 5 forces ``Qwen2Tokenizer`` for ``model_type``
    qwen2 and rebuilds its pre-tokenizer), the ``tokenizer.json`` is loaded as written instead.
    Either way the token ids are the file's.

    A GGUF model (a ``.gguf`` file, or a folder holding one and no ``config.json``) carries its
    tokenizer and chat template in its metadata (``tokenizer.ggml.*``, ``tokenizer.chat_template``):
    transformers builds the tokenizer from them (``_gguf_tokenizer``).

    Args:
        model_dir: model or tokenizer folder, or a GGUF file.
        chat_template: a Jinja chat template, or the path of a file holding one; replaces the
            folder's template.

    Returns:
        A ``transformers`` tokenizer (``PreTrainedTokenizerBase``).

    Raises:
        CheckpointError: the folder does not exist, has none of the tokenizer files, or
            transformers cannot read them.
    """
    gguf = _find_gguf(model_dir)
    if gguf is not None:
        tokenizer = _gguf_tokenizer(gguf)
        if chat_template is not None:
            tokenizer.chat_template = _read_template(chat_template)
        return tokenizer
    folder = Path(model_dir)
    if not folder.is_dir():
        raise CheckpointError(f"tokenizer folder {str(folder)!r} does not exist or is not a folder")
    present = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not present:
        raise CheckpointError(
            f"no tokenizer in {str(folder)!r}: expected one of {', '.join(TOKENIZER_FILES)}"
        )
    try:
        if present == ["tekken.json"]:
            tokenizer = _convert_tekken(folder / "tekken.json")
        else:
            tokenizer = _auto_tokenizer(folder)
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"cannot read the tokenizer in {str(folder)!r}: {exc}") from exc
    if chat_template is not None:
        tokenizer.chat_template = _read_template(chat_template)
    return tokenizer


def _auto_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    declared = _declared_class(folder)
    has_json = (folder / "tokenizer.json").is_file()
    if has_json and declared in _GENERIC_CLASSES:
        # What AutoTokenizer loads for these, minus its model_type substitution.
        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    # mistral_format=False: a tekken.json beside tokenizer.json must not switch AutoTokenizer
    # to the mistral_common backend, which has a different API.
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, mistral_format=False)
    loaded = type(tokenizer).__name__
    if has_json and declared is not None and declared.removesuffix("Fast") != loaded.removesuffix("Fast"):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    return tokenizer


def _find_gguf(model_dir: str | Path) -> Path | None:
    """``kvserve.model.gguf_file.find_gguf``, imported (with torch) only where a ``.gguf`` is in
    sight: the router loads tokenizers without torch."""
    path = Path(model_dir)
    if path.suffix.lower() != ".gguf" and not (path.is_dir() and any(path.glob("*.gguf"))):
        return None
    from kvserve.model.gguf_file import find_gguf

    return find_gguf(path)


def _gguf_tokenizer(path: Path) -> Any:
    """transformers' tokenizer of a GGUF file (its vocabulary, merges, special tokens and chat
    template), as the generic fast class: the file's pre-tokenizer as written, whatever the
    architecture (``AutoTokenizer`` would substitute e.g. ``Qwen2Tokenizer``)."""
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"cannot read the tokenizer of the GGUF file {str(path)!r}: {exc}") from exc


def _declared_class(folder: Path) -> str | None:
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    return json.loads(config_path.read_text(encoding="utf-8")).get("tokenizer_class")


def _convert_tekken(path: Path) -> Any:
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    return convert_tekken_tokenizer(str(path))


def _read_template(chat_template: str) -> str:
    # A template always contains "{"; a short string without one is taken as a file path.
    if "{" not in chat_template:
        path = Path(chat_template)
        if not path.is_file():
            raise CheckpointError(f"chat template file {chat_template!r} does not exist")
        return path.read_text(encoding="utf-8")
    return chat_template


def eos_token_ids(model_dir: str | Path, tokenizer: Any | None = None) -> frozenset[int]:
    """Every id that ends generation: the union of the tokenizer's ``eos_token_id``, config.json's
    ``eos_token_id`` (or its ``text_config``'s) and generation_config.json's (an int or a list).

    A GGUF model's are its eos, eot and eom ids (``GGUFFile.end_token_ids``) and the tokenizer's.

    Args:
        model_dir: model folder (or GGUF file); a missing config.json or generation_config.json is
            skipped.
        tokenizer: the loaded tokenizer, or ``None``.

    Returns:
        The ids, possibly empty.
    """
    folder = Path(model_dir)
    ids: set[int] = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gguf = _find_gguf(folder)
    if gguf is not None:
        from kvserve.model.gguf_file import open_gguf

        ids.update(open_gguf(gguf).end_token_ids())
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        value = data.get("eos_token_id")
        if value is None and isinstance(data.get("text_config"), dict):
            value = data["text_config"].get("eos_token_id")
        if value is not None:
            ids.update(int(v) for v in (value if isinstance(value, list) else [value]))
    return frozenset(ids)


def render_chat_template(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """Render a conversation to the prompt string with the chat template.

    Args:
        tokenizer: a Hugging Face tokenizer.
        messages: OpenAI-style messages (``{"role": ..., "content": ...}``).
        add_generation_prompt: append the template's opening of an assistant turn.
        continue_final_message: leave the last message open so the model continues it (the
            prompt ends with its content); excludes ``add_generation_prompt``.
        chat_template: a template that replaces the tokenizer's for this call.
        tools: tool definitions (OpenAI function schemas) the template may render.
        chat_template_kwargs: extra variables for the template (e.g. ``enable_thinking``).

    Returns:
        The rendered prompt text.

    Raises:
        InvalidRequestError: no template is available, the options conflict, or the template
            fails on these messages (its own message is quoted; ``param`` is ``chat_template``
            for a template that does not parse, else ``messages``).
    """
    import jinja2

    if not (chat_template or getattr(tokenizer, "chat_template", None)):
        raise InvalidRequestError(
            "this model's tokenizer has no chat template; give one (--chat-template or "
            "chat_template) or send a plain prompt to /v1/completions",
            param="messages",
        )
    if add_generation_prompt and continue_final_message:
        raise InvalidRequestError(
            "continue_final_message=true continues the last message and cannot be combined "
            "with add_generation_prompt=true; set one of them to false",
            param="continue_final_message",
        )
    try:
        return tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **(chat_template_kwargs or {}),
        )
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidRequestError(
            f"chat template does not parse: {exc.message} (line {exc.lineno})", param="chat_template"
        ) from exc
    except Exception as exc:  # raise_exception() in templates, jinja2 errors, TypeError, ValueError
        message = getattr(exc, "message", None) or str(exc)
        raise InvalidRequestError(f"chat template error: {message}", param="messages") from exc


def apply_chat_template(tokenizer: Any, messages: list[dict[str, Any]], add_special_tokens: bool = False,
                        **options: Any) -> list[int]:
    """Prompt token ids of a conversation: :func:`render_chat_template` with ``options`` (its
    keyword arguments), then encoding without adding special tokens (the template writes BOS itself
    where the model wants one), or with them on top when ``add_special_tokens`` (vLLM's request
    field).

    Returns:
        Token ids (``list[int]``).

    Raises:
        InvalidRequestError: as :func:`render_chat_template`.
    """
    text = render_chat_template(tokenizer, messages, **options)
    require_valid_unicode(text, "messages")
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def require_valid_unicode(text: str, param: str) -> None:
    """Raises:
    InvalidRequestError: ``text`` holds a lone UTF-16 surrogate (e.g. from a JSON ``"\\ud800"``
        escape), which is not a Unicode scalar value and cannot be encoded as UTF-8.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{param} is not valid Unicode: {text[exc.start:exc.end]!r} at character {exc.start} is a lone "
            f"surrogate; send valid UTF-8 text", param=param,
        ) from None
