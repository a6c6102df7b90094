"""``POST /v1/embeddings`` (OpenAI's embeddings, vLLM 0.32's extensions), vLLM's ``POST /pooling``
and ``POST /classify`` (a sequence classifier's probabilities): one engine request per input, all
admitted together (``AsyncLLM.add_requests``, one ``RequestStream``), run by the scheduler as
pooling requests (``kvserve.pooling``)::

    body ─► check_http_fields, model ─► worker thread: chat template (messages),
    InputProcessor.process_pooling per input ─► admit (rate limits: prompt tokens) ─►
    add_requests ─► each request's PoolingRequestOutput ─► {"data": [{"index", "embedding"}], "usage"}

A generative model answers 400 (start it with ``--runner pooling``); a pooling model answers the
generation endpoints 400 too (``InputProcessor.check_generates``, called by
``ServingState.check_ready``).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import JSONResponse, Response

from kvserve.api.auth import api_key_of
from kvserve.api.pooling_protocol import (ClassificationData, ClassificationRequest, ClassificationResponse,
                                          EmbeddingData, EmbeddingRequest, EmbeddingResponse, PoolingData,
                                          PoolingRequest, PoolingResponse, PoolingUsage, chat_messages, encode_vector)
from kvserve.api.serving_base import ServingState, new_request_id, until_disconnect
from kvserve.api.serving_chat import render_messages
from kvserve.api.tokenize_protocol import TokenizeRequest
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.input_processor import FieldNames
from kvserve.errors import InvalidRequestError
from kvserve.outputs import PoolingRequestOutput


def register(app: FastAPI, state: ServingState) -> None:
    """Add ``/v1/embeddings``, ``/pooling`` and ``/classify`` to ``app``."""
    serving = PoolingServing(state)

    @app.post("/classify")
    async def create_classify(body: ClassificationRequest, request: Request,
                              key: str = Depends(api_key_of)) -> Response:
        return await serving.create(body, request, key, "classify", functools.partial(_classification_response,
                                                                                     _labels(state)))

    @app.post("/v1/embeddings")
    async def create_embedding(body: EmbeddingRequest, request: Request, key: str = Depends(api_key_of)) -> Response:
        return await serving.create(body, request, key, "embd", _embedding_response)

    @app.post("/pooling")
    async def create_pooling(body: PoolingRequest, request: Request, key: str = Depends(api_key_of)) -> Response:
        return await serving.create(body, request, key, "pool", _pooling_response)


async def invoke_embeddings(state: ServingState, body: dict, request: Request, key: str) -> Response:
    """SageMaker's ``/invocations`` on a pooling model: the body as ``/v1/embeddings`` takes it
    (vLLM routes it by its request types, the embeddings request first)."""
    try:
        parsed = EmbeddingRequest.model_validate(body)
    except ValidationError as exc:  # worded as the route's own validation error
        raise RequestValidationError(exc.errors()) from None
    return await PoolingServing(state).create(parsed, request, key, "embd", _embedding_response)


async def invoke_classify(state: ServingState, body: dict, request: Request, key: str) -> Response:
    """SageMaker's ``/invocations`` on a classifier: the body as ``/classify`` takes it (vLLM's
    first request type there)."""
    try:
        parsed = ClassificationRequest.model_validate(body)
    except ValidationError as exc:  # worded as the route's own validation error
        raise RequestValidationError(exc.errors()) from None
    return await PoolingServing(state).create(parsed, request, key, "classify",
                                              functools.partial(_classification_response, _labels(state)))


class PoolingServing:
    """Handles the pooling routes against the engine in ``state``."""

    def __init__(self, state: ServingState):
        self.state = state

    async def create(self, body: EmbeddingRequest | PoolingRequest, raw_request: Request, api_key: str, prefix: str,
                     respond: Callable[[EmbeddingRequest | PoolingRequest, str, str, list[PoolingRequestOutput]],
                                       object]) -> Response:
        """Check, validate (the engine's input processor, on a worker thread), admit, run, answer.

        Raises:
            InvalidRequestError, APIError, RequestRejectedError: mapped to 4xx/503 by the app.
        """
        self.state.check_serving()
        lora_request = self.state.check_model(body.model)
        self.state.engine.input_processor.check_pools(body.api_name)  # a generative model: 400, --runner pooling
        body.check_http_fields()
        request_id = f"{prefix}-{body.request_id}" if body.request_id else new_request_id(prefix, raw_request)
        # The engine's ids must be unique among the requests in flight: a client's request_id is
        # the response's id (vLLM's), and two calls may send the same one.
        engine_id = f"{request_id}-{uuid.uuid4().hex[:8]}" if body.request_id else request_id
        requests = await asyncio.to_thread(self._prepare, body, engine_id, lora_request)
        outputs = await self.run(requests, raw_request, api_key, "input" if body.messages is None else "messages")
        if outputs is None:
            return Response(status_code=499)
        model = self.state.response_model_name(lora_request)
        return JSONResponse(respond(body, request_id, model, outputs).model_dump(mode="json"))

    async def run(self, requests: list[EngineRequest], raw_request: Request, api_key: str, param: str
                  ) -> list[PoolingRequestOutput] | None:
        """Admit a call's validated requests together (rate limits: their prompt tokens), run
        them, and return their outputs in order; None when the client left first (the requests
        are aborted). Every pooling route (``serving_score`` too) runs its requests through here.

        Raises:
            RequestRejectedError: a rate limit, or the engine's capacity (nothing runs).
            InvalidRequestError: more requests than the queue holds, naming ``param`` (the field
                of the call's inputs).
        """
        self.state.admit(api_key, sum(len(r.prompt_token_ids) for r in requests))
        try:
            stream = await self.state.engine.add_requests(requests)
        except InvalidRequestError as exc:  # more inputs than the queue holds: named as this request names them
            self.state.finish(api_key)
            raise InvalidRequestError(exc.message, param=param if exc.param == "prompt" else exc.param) from None
        except BaseException:
            self.state.finish(api_key)
            raise
        finished, outputs = await until_disconnect(raw_request, self._collect(stream, len(requests), api_key))
        return outputs if finished else None

    def _prepare(self, body: EmbeddingRequest | PoolingRequest, request_id: str, lora_request) -> list[EngineRequest]:
        """The input stage (a worker thread): each input (or rendered conversation) through
        ``InputProcessor.process_pooling``."""
        processor = self.state.engine.input_processor
        texts, conversations = body.prompts()
        add_special = body.add_special_tokens
        prompts: list = [{"prompt": t, "add_special_tokens": add_special is not False} if isinstance(t, str)
                         else {"prompt_token_ids": t} for t in texts]
        param = "input" if body.messages is None else "messages"
        for conversation in conversations or []:
            rendered = TokenizeRequest(messages=chat_messages(conversation, param),
                                       add_generation_prompt=body.add_generation_prompt,
                                       continue_final_message=body.continue_final_message,
                                       add_special_tokens=bool(add_special), chat_template_kwargs=body.chat_template_kwargs)
            prompts.append({"prompt_token_ids": render_messages(self.state, rendered)})
        params = body.pooling_params(body.task_name)
        fields = FieldNames(prompt=param)
        return [processor.process_pooling(f"{request_id}-{i}", prompt, params, priority=body.priority,
                                          fields=fields, lora_request=lora_request)
                for i, prompt in enumerate(prompts)]

    async def _collect(self, stream, count: int, api_key: str) -> list[PoolingRequestOutput]:
        """Every request's output, in input order; ends the call (aborts what is left, releases
        the admission) on every exit path."""
        outputs: list[PoolingRequestOutput | None] = [None] * count
        try:
            async for index, output in stream.outputs():
                if output.finished:
                    outputs[index] = output
        finally:
            stream.close()
            self.state.finish(api_key)
        return outputs


def _usage(outputs: list[PoolingRequestOutput]) -> PoolingUsage:
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return PoolingUsage(prompt_tokens=tokens, total_tokens=tokens)


def _embedding_response(body: EmbeddingRequest, request_id: str, model: str,
                        outputs: list[PoolingRequestOutput]) -> EmbeddingResponse:
    data = [EmbeddingData(index=i, embedding=encode_vector(o.outputs.data, body.encoding_format, body.embed_dtype,
                                                           body.endianness)) for i, o in enumerate(outputs)]
    return EmbeddingResponse(id=request_id, model=model, data=data, usage=_usage(outputs))


def _labels(state: ServingState) -> dict[int, str]:
    """The served classifier's label names (config.json's ``id2label``), or {}."""
    pooler = state.engine.input_processor.pooler_config
    return {} if pooler is None or pooler.classifier is None else pooler.classifier.id2label


def _classification_response(labels: dict[int, str], body: ClassificationRequest, request_id: str, model: str,
                             outputs: list[PoolingRequestOutput]) -> ClassificationResponse:
    """vLLM's: each input's probabilities and the name of the most probable label."""
    data = []
    for i, output in enumerate(outputs):
        probs = output.outputs.data.tolist()
        data.append(ClassificationData(index=i, label=labels.get(int(output.outputs.data.argmax())), probs=probs,
                                       num_classes=len(probs)))
    return ClassificationResponse(id=request_id, model=model, data=data, usage=_usage(outputs))


def _pooling_response(body: PoolingRequest, request_id: str, model: str,
                      outputs: list[PoolingRequestOutput]) -> PoolingResponse:
    data = [PoolingData(index=i, data=encode_vector(o.outputs.data, body.encoding_format, body.embed_dtype,
                                                    body.endianness)) for i, o in enumerate(outputs)]
    return PoolingResponse(id=request_id, model=model, data=data, usage=_usage(outputs))
