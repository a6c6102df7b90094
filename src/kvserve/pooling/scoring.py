"""Scoring (query, document) pairs with a pooling model, for ``/score``, ``/rerank`` and
``LLM.score``: which prompts run (``plan_scoring``) and how their outputs become one score per
pair (``pair_scores``), as vLLM 0.32's ``CrossEncoderIOProcessor`` / ``BiEncoderIOProcessor``::

    cross-encoder (a classifier of one label)    one prompt per pair (kvserve.pooling.score_inputs)
        score = the activated logit (sigmoid unless use_activation is false)
    bi-encoder (an embedding model)              the queries' prompts, then the documents'
        score = cosine(embedding(query), embedding(document)) (1:N: the one query for every pair)

``max_tokens_per_query`` / ``max_tokens_per_doc`` (vLLM's) cut each query / document text to that
many tokens first (at a character boundary of the tokenizer's offsets, ``truncate_text_to_tokens``).
Every prompt is one engine request; the caller admits all of a call's requests together.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch.nn.functional as F

from kvserve.errors import InvalidRequestError
from kvserve.outputs import PoolingRequestOutput
from kvserve.pooling.classifier_config import ClassifierConfig
from kvserve.pooling.score_inputs import TextPair, pair_prompt, pair_up


@dataclass(frozen=True)
class ScoreOptions:
    """How a call builds its pairs' prompts.

    Attributes:
        chat_template: a score template (the server's ``--chat-template``, ``LLM.score``'s
            argument), or None: the tokenizer's pair form.
        chat_template_kwargs: the template's variables (``instruction``, ...).
        max_tokens_per_query, max_tokens_per_doc: cut each query / document to this many tokens
            (0: not cut); each must be in [0, max_model_len).
    """

    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0


@dataclass(frozen=True)
class ScoringPlan:
    """The prompts of a scoring call.

    Attributes:
        kind: ``cross-encoder`` or ``bi-encoder``.
        task: the pooling task its requests run (``classify`` or ``embed``).
        prompts: what ``InputProcessor.process_pooling`` takes, in order.
        num_queries: bi-encoder: the first ``num_queries`` prompts are the queries (1 or one per
            pair), the rest the documents; cross-encoder: 0.
    """

    kind: str
    task: str
    prompts: list[TextPair | dict[str, Any] | str]
    num_queries: int = 0


class PairScore(NamedTuple):
    """One pair's result: its request id (a bi-encoder's: ``<query's>_<document's>``), score (0.0
    when it failed), the prompt tokens vLLM reports for it, its cached tokens, and its error (None
    when it succeeded)."""

    request_id: str
    score: float
    prompt_token_ids: list[int]
    num_cached_tokens: int
    error: str | None


def plan_scoring(kind: str, data_1: Any, data_2: Any, *, classifier: ClassifierConfig | None, tokenizer: Any,
                 max_model_len: int, names: tuple[str, str] = ("data_1", "data_2"),
                 options: ScoreOptions = ScoreOptions()) -> ScoringPlan:
    """The prompts that score ``data_1`` against ``data_2`` (each a text or a list of texts; the
    pairing rules of ``kvserve.pooling.score_inputs.pair_up``).

    Raises:
        InvalidRequestError: the pairing rules, an item that is not text (``param``: its field as
            ``names`` calls it), a ``max_tokens_per_query`` / ``max_tokens_per_doc`` out of
            [0, max_model_len) (vLLM's words).
    """
    limits = {"max_tokens_per_query": options.max_tokens_per_query, "max_tokens_per_doc": options.max_tokens_per_doc}
    for name, value in limits.items():
        _check_token_limit(value, name, max_model_len)
    pairs = pair_up(data_1, data_2, names)
    for query, document in pairs:
        for name, item in zip(names, (query, document)):
            if not isinstance(item, str):
                raise InvalidRequestError(f"{name} must hold text (multimodal content is not supported), got "
                                          f"{type(item).__name__}", param=name)
    cut_query = functools.partial(truncate_text_to_tokens, tokenizer=tokenizer, max_tokens=options.max_tokens_per_query)
    cut_doc = functools.partial(truncate_text_to_tokens, tokenizer=tokenizer, max_tokens=options.max_tokens_per_doc)
    pairs = [(cut_query(q), cut_doc(d)) for q, d in pairs]
    if kind == "cross-encoder":
        return ScoringPlan(kind, "classify", [pair_prompt(q, d, classifier, tokenizer, options.chat_template,
                                                          options.chat_template_kwargs) for q, d in pairs])
    queries = [pairs[0][0]] if not isinstance(data_1, list) or len(data_1) == 1 else [q for q, _ in pairs]
    return ScoringPlan(kind, "embed", queries + [d for _, d in pairs], num_queries=len(queries))


def _check_token_limit(value: Any, name: str, max_model_len: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(f"{name} must be a non-negative integer", param=name)
    if value != 0 and value >= max_model_len:
        raise InvalidRequestError(f"{name} ({value}) must be less than max_model_len ({max_model_len}).", param=name)


def truncate_text_to_tokens(text: str, tokenizer: Any, max_tokens: int) -> str:
    """``text`` cut to at most ``max_tokens`` tokens (without special tokens) at the character
    where its next token starts (the tokenizer's offsets; no decode round trip), as vLLM; 0: the
    text as it is."""
    if max_tokens <= 0:
        return text
    while text:
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoding["offset_mapping"]
        if len(encoding["input_ids"]) <= max_tokens:
            break
        end = min(offsets[max_tokens - 1][1], offsets[max_tokens][0])
        text = text[:min(end, len(text) - 1)]
    return text


def pair_scores(plan: ScoringPlan, outputs: list[PoolingRequestOutput], pad_token_id: int | None) -> list[PairScore]:
    """One ``PairScore`` per pair from the outputs of ``plan.prompts`` (in order)."""
    if plan.kind == "cross-encoder":
        return [PairScore(o.request_id, 0.0 if o.outputs is None else float(o.outputs.data.squeeze().item()),
                          o.prompt_token_ids, o.num_cached_tokens, _error(o)) for o in outputs]
    queries, documents = outputs[:plan.num_queries], outputs[plan.num_queries:]
    if len(queries) == 1:
        queries = queries * len(documents)
    padding = [] if pad_token_id is None else [pad_token_id]
    scores = []
    for query, document in zip(queries, documents):
        error = _error(query) or _error(document)
        score = 0.0 if error is not None else F.cosine_similarity(query.outputs.data.float(),
                                                                 document.outputs.data.float(), dim=0).item()
        tokens = query.prompt_token_ids + padding + document.prompt_token_ids
        scores.append(PairScore(f"{query.request_id}_{document.request_id}", score, tokens,
                                query.num_cached_tokens + document.num_cached_tokens, error))
    return scores


def _error(output: PoolingRequestOutput) -> str | None:
    if output.error is not None or output.outputs is None:
        return output.error or "the request finished without a pooled output"
    return None
