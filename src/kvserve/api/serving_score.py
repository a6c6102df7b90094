"""vLLM 0.32's scoring routes: ``POST /score`` (``/v1/score``) and ``POST /rerank`` (``/v1/rerank``,
``/v2/rerank``: Jina's and Cohere's shape). A cross-encoder (a classifier of one label: BERT,
XLM-RoBERTa, a decoder reranker such as Qwen3-Reranker) scores each (query, document) pair as one
prompt; an embedding model scores the cosine of the two texts' embeddings (``kvserve.pooling
.scoring``)::

    body ─► check_http_fields, model ─► worker thread: InputProcessor.check_scores (the model
    scores?), plan_scoring (pairs 1:1 / 1:N / N:N, the pair prompts), process_pooling per prompt
    ─► PoolingServing.run (admitted together, rate limits: prompt tokens) ─► pair_scores
    ─► {"data": [{"index", "score"}]} | {"results": [{"index", "document", "relevance_score"}]}

A generative model answers 400 naming ``model`` (vLLM serves no scoring route there: 404), so
does a classifier of more than one label (vLLM's words). The server's ``--chat-template``, when
given, is the score template (vLLM applies one only when given explicitly).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any, NamedTuple

from fastapi import Depends, FastAPI, Request
from starlette.responses import JSONResponse, Response

from kvserve.api.auth import api_key_of
from kvserve.api.pooling_protocol import PoolingUsage
from kvserve.api.score_protocol import (SCORE_FIELD_PAIRS, RerankDocument, RerankRequest, RerankResponse, RerankResult,
                                        RerankUsage, ScoreRequest, ScoreResponse, ScoreResponseData)
from kvserve.api.serving_base import ServingState, new_request_id
from kvserve.api.serving_pooling import PoolingServing, invoke_classify, invoke_embeddings
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.input_processor import FieldNames
from kvserve.pooling.scoring import PairScore, ScoringPlan, pair_scores, plan_scoring


def register(app: FastAPI, state: ServingState) -> None:
    """Add ``/score``, ``/v1/score``, ``/rerank``, ``/v1/rerank`` and ``/v2/rerank`` to ``app``."""
    serving = ScoreServing(state)

    @app.post("/score")
    async def create_score(body: ScoreRequest, request: Request, key: str = Depends(api_key_of)) -> Response:
        return await serving.score(body, request, key)

    @app.post("/v1/score")
    async def create_score_v1(body: ScoreRequest, request: Request, key: str = Depends(api_key_of)) -> Response:
        return await serving.score(body, request, key)

    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.add_api_route(path, _rerank_route(serving), methods=["POST"], name=f"rerank{path.replace('/', '_')}")


def _rerank_route(serving: ScoreServing):
    async def do_rerank(body: RerankRequest, request: Request, key: str = Depends(api_key_of)) -> Response:
        return await serving.rerank(body, request, key)

    return do_rerank


async def invoke_pooling(state: ServingState, body: dict, request: Request, key: str) -> Response:
    """SageMaker's ``/invocations`` on a pooling model, routed by the body as vLLM tries its request
    types: ``input`` / ``messages`` is the model's own task (embeddings, or ``/classify`` for a
    classifier), ``query`` with ``documents`` a rerank, the two sides of a score request a score;
    anything else is worded as an embeddings (or classify) request's validation error."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    scoring = not ({"input", "messages"} & body.keys()) and (
        {"query", "documents"} <= body.keys() or any({a, b} <= body.keys() for a, b in SCORE_FIELD_PAIRS))
    if not scoring:
        classify = state.engine.input_processor.pooler_config.task == "classify"
        return await (invoke_classify if classify else invoke_embeddings)(state, body, request, key)
    serving = ScoreServing(state)
    try:
        parsed = (RerankRequest if "query" in body else ScoreRequest).model_validate(body)
    except ValidationError as exc:  # worded as the route's own validation error
        raise RequestValidationError(exc.errors()) from None
    if isinstance(parsed, RerankRequest):
        return await serving.rerank(parsed, request, key)
    return await serving.score(parsed, request, key)


class _Call(NamedTuple):
    """One scoring call's plan and its engine requests (in the plan's prompt order)."""

    plan: ScoringPlan
    requests: list[EngineRequest]


class ScoreServing:
    """Handles the scoring routes against the engine in ``state``."""

    def __init__(self, state: ServingState):
        self.state = state
        self.pooling = PoolingServing(state)

    async def score(self, body: ScoreRequest, raw_request: Request, api_key: str) -> Response:
        """``/score``: one score per pair, in pair order.

        Raises:
            InvalidRequestError, APIError, RequestRejectedError: mapped to 4xx/503 by the app.
        """
        self._check(body)
        names, data_1, data_2 = body.sides()
        result = await self._run(body, raw_request, api_key, names, data_1, data_2)
        if result is None:
            return Response(status_code=499)
        request_id, model, call, scores = result
        data = [ScoreResponseData(index=i, score=s.score) for i, s in enumerate(scores)]
        tokens = _prompt_tokens(call)
        return JSONResponse(ScoreResponse(id=request_id, model=model, data=data, usage=PoolingUsage(
            prompt_tokens=tokens, total_tokens=tokens)).model_dump(mode="json"))

    async def rerank(self, body: RerankRequest, raw_request: Request, api_key: str) -> Response:
        """``/rerank``: the documents by relevance to the query, best first, cut to ``top_n``.

        Raises:
            InvalidRequestError, APIError, RequestRejectedError: mapped to 4xx/503 by the app.
        """
        self._check(body)
        query, documents = body.texts()
        result = await self._run(body, raw_request, api_key, ("query", "documents"), query, documents)
        if result is None:
            return Response(status_code=499)
        request_id, model, call, scores = result
        results = [RerankResult(index=i, relevance_score=s.score,
                                document=RerankDocument(text=documents[i]) if body.return_documents else None)
                   for i, s in enumerate(scores)]
        results.sort(key=lambda r: r.relevance_score, reverse=True)  # stable: ties keep document order
        if 0 < body.top_n < len(results):
            results = results[:body.top_n]
        tokens = _prompt_tokens(call)
        response = RerankResponse(id=request_id, model=model, results=results,
                                  usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens))
        return JSONResponse(response.model_dump(mode="json", exclude_none=not body.return_documents))

    def _check(self, body: ScoreRequest | RerankRequest) -> None:
        self.state.check_serving()
        self.state.engine.input_processor.check_pools("Score")  # a generative model: 400 naming model
        body.check_http_fields()

    async def _run(self, body: ScoreRequest | RerankRequest, raw_request: Request, api_key: str,
                   names: tuple[str, str], data_1: Any, data_2: Any) -> tuple[str, str, _Call, list[PairScore]] | None:
        """Validate and build the call's requests (a worker thread), run them, score the pairs;
        None when the client left."""
        lora_request = self.state.check_model(body.model)
        request_id = f"score-{body.request_id}" if body.request_id else new_request_id("score", raw_request)
        engine_id = f"{request_id}-{uuid.uuid4().hex[:8]}" if body.request_id else request_id
        call = await asyncio.to_thread(self._prepare, body, engine_id, names, data_1, data_2, lora_request)
        outputs = await self.pooling.run(call.requests, raw_request, api_key, names[1])
        if outputs is None:
            return None
        pad = getattr(self.state.engine.input_processor.tokenizer, "pad_token_id", None)
        return request_id, self.state.response_model_name(lora_request), call, pair_scores(call.plan, outputs, pad)

    def _prepare(self, body: ScoreRequest | RerankRequest, request_id: str, names: tuple[str, str], data_1: Any,
                 data_2: Any, lora_request: Any) -> _Call:
        """The input stage: the model's scoring kind, the plan, each prompt through
        ``InputProcessor.process_pooling``."""
        processor = self.state.engine.input_processor
        kind = processor.check_scores()
        plan = plan_scoring(kind, data_1, data_2, classifier=processor.pooler_config.classifier,
                            tokenizer=processor.tokenizer, max_model_len=processor.max_model_len, names=names,
                            options=body.options(self.state.settings.chat_template))
        params = dataclasses.replace(body.pooling_params(), task=plan.task)
        requests = []
        for i, prompt in enumerate(plan.prompts):
            field = names[0] if i < plan.num_queries else names[1]
            requests.append(processor.process_pooling(f"{request_id}-{i}", prompt, params, priority=body.priority,
                                                      fields=FieldNames(prompt=field), lora_request=lora_request))
        return _Call(plan, requests)


def _prompt_tokens(call: _Call) -> int:
    """vLLM's usage of a scoring call: the prompt tokens of its engine requests."""
    return sum(len(r.prompt_token_ids) for r in call.requests)
