"""Request and response models of vLLM 0.32's scoring routes: ``POST /score`` (and ``/v1/score``)
and ``POST /rerank`` (``/v1/rerank``, ``/v2/rerank``: Jina's and Cohere's rerank shape).

This module only parses and checks the HTTP shapes: which field names carry the two sides of a
score request (vLLM's four spellings), what a rerank document may be, and the vLLM extensions
kvserve does not implement (refused by name). The values are checked once by the engine's input
processor and ``kvserve.pooling.score_inputs`` (pairing rules, truncation, the context).

Sources: vLLM 0.32 ``vllm/entrypoints/pooling/scoring/protocol.py``,
``vllm/entrypoints/pooling/base/protocol.py``; Jina AI's and Cohere's rerank APIs (``documents``
as ``{"text": ...}`` objects, ``return_documents``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from kvserve.api.pooling_protocol import PoolingListResponse
from kvserve.api.protocol import OpenAIBaseModel
from kvserve.errors import InvalidRequestError
from kvserve.pooling.params import PoolingParams
from kvserve.pooling.scoring import ScoreOptions

# vLLM's names of a score request's two sides, in the order its request types are tried.
SCORE_FIELD_PAIRS: tuple[tuple[str, str], ...] = (("queries", "documents"), ("queries", "items"),
                                                  ("data_1", "data_2"), ("text_1", "text_2"))
# vLLM fields kvserve does not implement: name -> (vLLM's defaults, why).
UNSUPPORTED_SCORE_FIELDS: dict[str, tuple[tuple, str]] = {
    "padding": ((None, "do_not_pad"), "prompts are not padded (padding 'max_length' is not supported)"),
    "mm_processor_kwargs": ((None,), "multimodal inputs are not supported"),
    "cache_salt": ((None,), "pooling runs without the prefix cache, so there is nothing to salt"),
    "chat_template": ((None,), "a per-request chat template is not accepted; start the server with --chat-template"),
}


class _ScoringRequestBase(OpenAIBaseModel):
    """Fields ``/score`` and ``/rerank`` share (vLLM's ``ScoringRequestMixin``)."""

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    request_id: str | None = None
    priority: int = 0
    use_activation: bool | None = None
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def check_http_fields(self) -> None:
        """Raises InvalidRequestError: ``normalize`` (vLLM's words) or a refused extension set
        to anything but vLLM's default."""
        extra = self.model_extra or {}
        if "normalize" in extra:
            raise InvalidRequestError("Parameter `normalize` was removed; use `use_activation` instead.",
                                      param="normalize")
        for name, value in extra.items():
            entry = UNSUPPORTED_SCORE_FIELDS.get(name)
            if entry is not None and not any(value is d or value == d for d in entry[0]):
                raise InvalidRequestError(f"{name} is not supported by this server: {entry[1]}", param=name)

    def options(self, chat_template: str | None) -> ScoreOptions:
        """The pair-building options with the server's score template; ``instruction`` folded
        into ``chat_template_kwargs`` (an explicit ``chat_template_kwargs["instruction"]`` wins,
        as vLLM)."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.instruction is not None:
            kwargs.setdefault("instruction", self.instruction)
        return ScoreOptions(chat_template=chat_template, chat_template_kwargs=kwargs or None,
                            max_tokens_per_query=self.max_tokens_per_query, max_tokens_per_doc=self.max_tokens_per_doc)

    def pooling_params(self) -> PoolingParams:
        """The call's parameters; the task is set by the scoring plan (``classify`` or ``embed``)."""
        return PoolingParams(use_activation=self.use_activation, truncate_prompt_tokens=self.truncate_prompt_tokens,
                             truncation_side=self.truncation_side)


class ScoreRequest(_ScoringRequestBase):
    """``POST /score``: the two sides under any of vLLM's names (``SCORE_FIELD_PAIRS``), each a
    text or a list of texts."""

    queries: Any = None
    documents: Any = None
    items: Any = None
    data_1: Any = None
    data_2: Any = None
    text_1: Any = None
    text_2: Any = None

    def sides(self) -> tuple[tuple[str, str], Any, Any]:
        """((first field's name, second's), first side, second side), as vLLM picks its request
        type: the first pair of ``SCORE_FIELD_PAIRS`` whose both fields are set.

        Raises:
            InvalidRequestError: no pair complete (naming the missing field), or a field of another
                spelling beside the complete pair (naming it: one of them would be dropped).
        """
        for first, second in SCORE_FIELD_PAIRS:
            if getattr(self, first) is not None and getattr(self, second) is not None:
                for name in dict.fromkeys(n for pair in SCORE_FIELD_PAIRS for n in pair):
                    if name not in (first, second) and getattr(self, name) is not None:
                        raise InvalidRequestError(f"{name} cannot be given beside {first} and {second}: give the "
                                                  "two sides under one spelling (queries and documents, queries and "
                                                  "items, data_1 and data_2, or text_1 and text_2)", param=name)
                return (first, second), getattr(self, first), getattr(self, second)
        for first, second in SCORE_FIELD_PAIRS:
            if getattr(self, first) is not None or getattr(self, second) is not None:
                missing = second if getattr(self, first) is not None else first
                raise InvalidRequestError(f"{missing} is required beside {first if missing == second else second}",
                                          param=missing)
        raise InvalidRequestError("give the texts to score as queries and documents (or data_1 and data_2, text_1 "
                                  "and text_2, queries and items)", param="queries")


class RerankRequest(_ScoringRequestBase):
    """``POST /rerank``: one ``query`` against ``documents`` (texts, or ``{"text": ...}`` objects
    as Jina and Cohere send them); ``top_n`` 0 = every document; ``return_documents`` (Jina's and
    Cohere's field; vLLM always returns them)."""

    query: Any = None
    documents: Any = None
    top_n: int = Field(default=0, ge=0)
    return_documents: bool = True

    def texts(self) -> tuple[str, list[str]]:
        """(the query, the documents' texts).

        Raises:
            InvalidRequestError: a missing query or documents, an empty list of documents, a
                query or document that is not text (named by its index).
        """
        if self.query is None:
            raise InvalidRequestError("query is required", param="query")
        if not isinstance(self.query, str):
            raise InvalidRequestError(f"query must be text (multimodal content is not supported), got "
                                      f"{type(self.query).__name__}", param="query")
        if self.documents is None:
            raise InvalidRequestError("documents is required", param="documents")
        documents = self.documents if isinstance(self.documents, list) else [self.documents]
        if not documents:
            raise InvalidRequestError("At least one text_pair element must be given", param="documents")
        return self.query, [_document_text(d, i) for i, d in enumerate(documents)]


def _document_text(document: Any, index: int) -> str:
    if isinstance(document, str):
        return document
    if isinstance(document, dict) and set(document) == {"text"} and isinstance(document["text"], str):
        return document["text"]
    raise InvalidRequestError(f"documents[{index}] must be text or {{\"text\": \"...\"}} (multimodal content is not "
                              "supported)", param=f"documents.{index}")


class ScoreResponseData(BaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(PoolingListResponse[ScoreResponseData]):
    """``/score`` (id ``score-...``)."""


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
