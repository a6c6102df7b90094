"""The inputs of scoring (``/score``, ``/rerank``, ``LLM.score``): how queries pair with documents,
and how one (query, document) pair becomes a cross-encoder's prompt (vLLM 0.32's rules).

Pairing (``pair_up``)::

    1 query,  N documents  -> (q, d1) ... (q, dN)          1:1 and 1:N
    N queries, N documents -> (q1, d1) ... (qN, dN)        N:N
    otherwise (N:M, or an empty side) -> refused, vLLM's words

One pair's prompt (``pair_prompt``), for a ``classify`` model (a cross-encoder):

    --chat-template given   the template rendered over [{"role": "query"}, {"role": "document"}]
                            (``chat_template_kwargs``, e.g. ``instruction``), tokenized as text
                            with special tokens (vLLM applies a score template only when one is
                            given explicitly; Qwen3-Reranker's is docs/pooling.md's)
    use_sep_token (default) ``tokenizer(query, document)``: the tokenizer's pair form
                            ([CLS] q [SEP] d [SEP] for BERT, <s> q </s></s> d </s> for RoBERTa)
                            with its segment ids (``TextPair``)
    otherwise (LLM reranker) the text ``query + document`` (no separator)

A pair's segment ids are zeros then ones; the engine carries only where the ones start
(``compress_token_type_ids``: vLLM's compressed form), as ``EngineRequest.token_type_start``.
An embedding model scores a pair by the cosine of the two texts' embeddings (a bi-encoder:
each text its own request).

Source: vLLM 0.32 ``vllm/entrypoints/pooling/scoring/utils.py`` (``validate_score_input``,
``compress_token_type_ids``), ``scoring/io_processor.py`` (``get_score_prompt``,
``_apply_post_tokenization_to_token_type_ids``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvserve.errors import InvalidRequestError
from kvserve.pooling.classifier_config import ClassifierConfig
from kvserve.pooling.params import PoolingParams


class TextPair(NamedTuple):
    """A cross-encoder's prompt: ``tokenizer(text, text_pair)`` (transformers' argument names)."""

    text: str
    text_pair: str


def pair_up(data_1: Any, data_2: Any, names: tuple[str, str] = ("data_1", "data_2")) -> list[tuple[Any, Any]]:
    """The (query, document) pairs of two inputs, each one item or a list (module docstring).

    Raises:
        InvalidRequestError: an empty side, or N:M with N > 1 and N != M (``param``: the first
            field of ``names`` for a length mismatch, else the empty one).
    """
    first = list(data_1) if isinstance(data_1, list) else [data_1]
    second = list(data_2) if isinstance(data_2, list) else [data_2]
    if len(first) > 1 and len(first) != len(second):
        raise InvalidRequestError(f"Input lengths must be either 1:1, 1:N or N:N (got {len(first)} {names[0]} and "
                                  f"{len(second)} {names[1]})", param=names[0])
    if not first:
        raise InvalidRequestError("At least one text element must be given", param=names[0])
    if not second:
        raise InvalidRequestError("At least one text_pair element must be given", param=names[1])
    if len(first) == 1:
        first = first * len(second)
    return list(zip(first, second))


def pair_prompt(query: str, document: str, classifier: ClassifierConfig, tokenizer: Any,
                chat_template: str | None = None, chat_template_kwargs: dict[str, Any] | None = None
                ) -> TextPair | dict[str, Any]:
    """One pair's prompt for ``process_pooling`` (module docstring): a ``TextPair`` or a text
    prompt ``{"prompt": ..., "add_special_tokens": True}``.

    Raises:
        InvalidRequestError: ``chat_template_kwargs`` naming a reserved key, or a template that
            fails (``kvserve.tokenizer.render_chat_template``).
    """
    if chat_template is not None:
        from kvserve.tokenizer import render_chat_template

        kwargs = dict(chat_template_kwargs or {})
        reserved = sorted({"chat_template", "tools", "tokenize"} & kwargs.keys())
        if reserved:
            raise InvalidRequestError(f"chat_template_kwargs contains reserved keys that conflict with fixed scorer "
                                      f"arguments: {reserved}", param="chat_template_kwargs")
        messages = [{"role": "query", "content": query}, {"role": "document", "content": document}]
        text = render_chat_template(tokenizer, messages, add_generation_prompt=False, chat_template=chat_template,
                                    chat_template_kwargs=kwargs)
        return {"prompt": text, "add_special_tokens": True}
    if classifier.use_sep_token:
        return TextPair(query, document)
    return {"prompt": query + document, "add_special_tokens": True}


def pair_token_ids(tokenizer: Any, pair: TextPair, params: PoolingParams, max_model_len: int,
                   token_types: bool) -> tuple[list[int], int | None]:
    """(token ids, where the token types turn 1 or None) of a ``TextPair`` after truncation, as
    vLLM: ``truncate_prompt_tokens`` without a ``truncation_side`` lets the tokenizer cut the pair
    (its ``longest_first`` strategy, special tokens kept); with one, the whole pair's ids and
    segment ids are sliced (``left`` keeps the last). ``token_types``: the model reads segment ids
    (``PoolerConfig.token_types``), else None."""
    limit = params.truncate_prompt_tokens
    limit = max_model_len if limit == -1 else limit
    kwargs: dict[str, Any] = {"add_special_tokens": True}
    if limit is not None and params.truncation_side is None:
        kwargs.update(truncation=True, max_length=limit)
    encoded = tokenizer(pair.text, text_pair=pair.text_pair, **kwargs)
    ids = list(encoded["input_ids"])
    types = encoded.get("token_type_ids")
    types = list(types) if types is not None else None
    if limit is not None and len(ids) > limit:
        side = params.truncation_side or getattr(tokenizer, "truncation_side", "right")
        cut = slice(len(ids) - limit, None) if side == "left" else slice(0, limit)
        ids, types = ids[cut], None if types is None else types[cut]
    if not token_types or types is None:
        return ids, None
    start = compress_token_type_ids(types)
    return ids, None if start >= len(ids) else start


def compress_token_type_ids(token_type_ids: list[int]) -> int:
    """The index of the first 1 of zeros-then-ones segment ids, or their length when all are 0.

    Raises:
        ValueError: ids that are not zeros followed by ones (vLLM's words).
    """
    first_one = len(token_type_ids)
    for i, type_id in enumerate(token_type_ids):
        if type_id > 1 or (type_id == 0 and first_one < i):
            raise ValueError("Token type ids are expected to be a sequence of zeros followed by a sequence of ones")
        if type_id == 1 and first_one > i:
            first_one = i
    return first_one
