"""The FastAPI application of the OpenAI-compatible server.

    GET  /health, /ping          200 when the engine is ready, else 503 (/health: HEAD too; /ping:
                                 POST too, SageMaker's probe)                    (open)
    GET  /load                   {"server_load": generation requests in flight} (0 without
                                 --enable-server-load-tracking)                  (open)
    GET  /version                {"version"}; with the key (or without keys set) also "commit",
                                 "dirty", "quantization", "engine"               (open)
    GET  /metrics                Prometheus text format                          (open)
    POST /invocations            SageMaker's route: a chat body (``messages``) to chat, else completions
    GET  /v1/models              the served model (and its LoRA adapters, ``parent`` = the model)
    POST /v1/load_lora_adapter   vLLM's runtime adapter loading (with --allow-runtime-lora-updating)
    POST /v1/unload_lora_adapter
    POST /v1/completions         see serving_completion.py
    POST /v1/chat/completions    see serving_chat.py
    POST /v1/messages            Anthropic's Messages API, run as a chat completion (serving_messages.py);
                                 its errors in Anthropic's shape; the key also as x-api-key
    POST /v1/messages/count_tokens  the prompt's token count of a Messages request
    POST /v1/responses           OpenAI's Responses API, run as a chat completion (serving_responses.py)
    GET, DELETE /v1/responses/{id}   a stored response (store: true); GET ?stream=true replays a
                                 streamed background response's events
    POST /v1/responses/{id}/cancel   cancel a background response
    POST /tokenize, /detokenize  vLLM's tokenizer endpoints
    POST /v1/embeddings          OpenAI's embeddings of a pooling model (--runner pooling; serving_pooling.py)
    POST /pooling                vLLM's pooling route (its shape; serving_pooling.py)
    POST /classify               a sequence classifier's probabilities (vLLM's; serving_pooling.py)
    POST /score, /v1/score       vLLM's pair scores: a cross-encoder / reranker, or an embedding
                                 model's cosine (serving_score.py)
    POST /rerank, /v1/rerank, /v2/rerank   documents ranked against a query (Jina's and Cohere's
                                 shape; serving_score.py)
    GET  /docs, /redoc           API pages; /openapi.json the schema (absent with
                                 --disable-fastapi-docs)

Every route but the open ones needs the API key when keys are set (``kvserve.api.auth``, checked
before the body is read).

Every response carries ``X-Request-Id``; a 405 carries ``Allow``; CORS, body and header limits are
middleware (``kvserve.api.middleware``).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, ValidationError

import kvserve
from kvserve.api.anthropic_errors import AnthropicErrorMiddleware
from kvserve.api.auth import AuthMiddleware, api_key_of
from kvserve.api.errors import APIError, install_error_handlers
from kvserve.api.middleware import RequestGuardMiddleware, RequestIdMiddleware
from kvserve.api.chat_protocol import ChatCompletionRequest, check_generation_prompt
from kvserve.api.protocol import CompletionRequest, LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from kvserve.api.rate_limit import RateLimiter
from kvserve.api.responses import DetokenizeResponse, ModelCard, ModelList, TokenizeResponse
from kvserve.api.serving_base import ServingState, check_token_ids
from kvserve.api.serving_chat import ChatServing, render_messages
from kvserve.api.serving_completion import CompletionServing
from kvserve.api.serving_pooling import register as register_pooling_routes
from kvserve.api.serving_score import invoke_pooling, register as register_score_routes
from kvserve.api.serving_messages import register as register_messages_routes
from kvserve.api.serving_responses import register as register_responses_routes
from kvserve.api.settings import ServerSettings
from kvserve.api.tokenize_protocol import DetokenizeRequest, TokenizeRequest
from kvserve.api.tokenization import tokenize_prompt
from kvserve.errors import InvalidRequestError

if TYPE_CHECKING:
    from kvserve.engine.async_llm import EngineClient


def build_app(engine: EngineClient, settings: ServerSettings) -> FastAPI:
    """The app serving ``engine``; ``app.state.serving`` holds the :class:`ServingState`
    (``accepting`` is turned off by :func:`kvserve.api.run.serve` on shutdown)."""
    app = FastAPI(title="kvserve", version=kvserve.__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.router.route_class = OffLoopJsonRoute
    app.root_path = settings.root_path  # as vLLM: /llm/v1/... and /v1/... (prefix stripped by a proxy) both route
    limiter = RateLimiter(settings.requests_per_minute, settings.tokens_per_minute,
                          settings.max_concurrent_requests)
    state = ServingState(engine, settings, limiter)
    app.state.serving = state
    install_error_handlers(app)
    _add_middleware(app, engine, settings)
    _add_open_routes(app, state)
    _add_v1_routes(app, state)
    register_messages_routes(app, state)  # /v1/messages, /v1/messages/count_tokens
    register_responses_routes(app, state)  # /v1/responses and /v1/responses/{id}[/cancel]
    _add_lora_routes(app, state)
    _add_tokenizer_routes(app, state)
    register_pooling_routes(app, state)  # /v1/embeddings, /pooling, /classify
    register_score_routes(app, state)  # /score, /v1/score, /rerank, /v1/rerank, /v2/rerank
    if not settings.disable_fastapi_docs:
        _add_docs_routes(app, state)
    return app


def _add_middleware(app: FastAPI, engine: EngineClient, settings: ServerSettings) -> None:
    """Outermost last: CORS, X-Request-Id, refusal counting, the API key, body and header limits,
    routes."""
    app.add_middleware(RequestGuardMiddleware, max_body_bytes=settings.max_request_body_bytes,
                       body_timeout=settings.body_read_timeout, max_header_count=settings.h11_max_header_count)
    app.add_middleware(AuthMiddleware, api_keys=settings.api_keys)  # before the guard reads the body
    metrics = getattr(engine, "prometheus_metrics", None)
    if metrics is not None:  # counts refused generation requests by reason (kvserve.metrics.http)
        from kvserve.metrics.http import RejectionCounterMiddleware, instrument_routes

        app.add_middleware(RejectionCounterMiddleware, metrics=metrics)
        instrument_routes(app, engine.metrics_registry)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(AnthropicErrorMiddleware)  # the errors of /v1/messages in Anthropic's shape
    app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins),
                       allow_methods=list(settings.allowed_methods), allow_headers=list(settings.allowed_headers),
                       allow_credentials=settings.allow_credentials, expose_headers=["X-Request-Id"])


class OffLoopJsonRoute(APIRoute):
    """A route whose JSON body is parsed on a worker thread (FastAPI would ``json.loads`` it on the
    event loop: a 20 MB body stalled every other request, ``/health`` included, for seconds)."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def parse_then_handle(request: Request) -> Response:
            body = await request.body()
            if len(body) >= OFF_LOOP_BODY_BYTES and "json" in request.headers.get("content-type", ""):
                try:
                    request._json = await asyncio.to_thread(parse_json, body)  # Starlette's cache of .json()
                except ValueError:
                    pass  # FastAPI words the error when it parses it again
            return await handler(request)

        return parse_then_handle


OFF_LOOP_BODY_BYTES = 64 << 10  # smaller bodies parse faster than a thread hop
parse_json = json.loads  # (a seam for tests)


def _build_info() -> dict:
    """``/version``: the package version and, from a source checkout, the git commit the server
    started on (``dirty`` when the tree had changes), so benchmark results name the code they ran."""
    import subprocess
    from pathlib import Path

    info: dict = {"version": kvserve.__version__}
    root = Path(kvserve.__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        info.update(commit=commit, dirty=bool(dirty))
    except (OSError, subprocess.SubprocessError):
        pass  # an installed wheel: no checkout to ask
    return info


def _add_open_routes(app: FastAPI, state: ServingState) -> None:
    @app.api_route("/health", methods=["GET", "HEAD"], include_in_schema=False)  # HEAD for load balancers
    @app.api_route("/ping", methods=["GET", "POST"], include_in_schema=False)  # SageMaker's probe, as vLLM
    async def health() -> Response:
        if not state.engine.is_ready:
            raise APIError(503, "The engine is not ready.", code="engine_not_ready")
        if not state.accepting:
            raise APIError(503, "The server is shutting down.", code="shutting_down")
        return Response(status_code=200)

    @app.get("/load")
    async def load() -> dict:
        return {"server_load": state.in_flight if state.settings.enable_server_load_tracking else 0}

    build = _build_info()

    @app.get("/version")
    async def version(request: Request) -> dict:
        if state.settings.api_keys and "api_key" not in request.scope.get("state", {}):
            return {"version": build["version"]}  # the commit, the model's path and the engine need the key
        return {**build, "quantization": getattr(state.engine, "quantization", None),
                "engine": getattr(state.engine, "serving_facts", None)}

    @app.get("/metrics")
    async def metrics() -> Response:
        registry = getattr(state.engine, "metrics_registry", None) or REGISTRY  # per-server registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _add_v1_routes(app: FastAPI, state: ServingState) -> None:
    completions = CompletionServing(state)
    chat = ChatServing(state)

    def model_card(name: str) -> ModelCard:
        return ModelCard(id=name, root=state.settings.model_path or state.engine.model_name,
                         max_model_len=state.engine.max_model_len, quantization=getattr(state.engine, "quantization", None))

    def lora_card(lora) -> ModelCard:  # vLLM: root = the adapter's folder, parent = its base model
        return ModelCard(id=lora.lora_name, root=lora.lora_path, parent=lora.base_model_name or state.model_name,
                         max_model_len=state.engine.max_model_len)

    names = list(dict.fromkeys([state.model_name, *state.settings.served_model_aliases]))

    @app.get("/debug/slo")
    async def debug_slo() -> dict:
        """The latency-target side (``kvserve.slo``): the step-cost model's fit, refusals and
        acceptances despite a predicted miss by class, and the ``--slo-classes``."""
        slo = getattr(getattr(state.engine, "snapshot", None), "slo", None)
        classes = {name: {"ttft_ms": c.target.ttft_ms, "tpot_ms": c.target.tpot_ms, "on_miss": c.target.on_miss,
                          "priority": c.priority, "api_keys": len(c.api_keys)}
                   for name, c in state.settings.slo_classes.classes.items()}
        if slo is None:
            return {"step_cost": None, "refused": {}, "queued_predicted_miss": {}, "classes": classes}
        return {"step_cost": slo.step_cost, "refused": slo.refused, "queued_predicted_miss": slo.queued_predicted_miss,
                "classes": classes}

    @app.get("/v1/models")
    async def models() -> ModelList:
        adapters = state.lora_registry.list() if state.lora_registry is not None else []
        # one card per served name, then one per adapter, as vLLM
        return ModelList(data=[model_card(name) for name in names] + [lora_card(a) for a in adapters])

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> ModelCard:
        lora_request = state.check_model(model_id)  # 404 model_not_found for another name
        if lora_request is not None:
            return lora_card(lora_request)
        return model_card(model_id if model_id in names else state.model_name)

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request,
                                key: str = Depends(api_key_of)) -> Response:
        return await completions.create(body, request, key)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                     key: str = Depends(api_key_of)) -> Response:
        return await chat.create(body, request, key)

    @app.post("/invocations")
    async def invocations(request: Request, key: str = Depends(api_key_of)) -> Response:
        """SageMaker's inference route, as vLLM: a body with ``messages`` is a chat completion, one
        with ``prompt`` a completion (each refused with its own route's message); on a pooling model
        a body is an embeddings or classify request, a rerank or a score (``invoke_pooling``)."""
        body = await _json_body(request)
        if isinstance(body, dict) and state.engine.input_processor.pooler_config is not None:
            return await invoke_pooling(state, body, request, key)
        if isinstance(body, dict) and "messages" in body:
            return await chat.create(_validated(ChatCompletionRequest, body), request, key)
        if isinstance(body, dict) and "prompt" in body:
            return await completions.create(_validated(CompletionRequest, body), request, key)
        raise InvalidRequestError("Cannot find suitable handler for request. Expected one of: "
                                  "['ChatCompletionRequest', 'CompletionRequest'] (a body with 'messages' or 'prompt')")


async def _json_body(request: Request):
    try:  # a large body was parsed off the event loop already (OffLoopJsonRoute)
        return await request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"The request body is not valid JSON: {exc}") from None


def _validated(model: type[BaseModel], body: dict):
    try:
        return model.model_validate(body)
    except ValidationError as exc:  # worded as the route's own validation error
        raise RequestValidationError(exc.errors()) from None


def _add_lora_routes(app: FastAPI, state: ServingState) -> None:
    """vLLM's runtime adapter endpoints; without ``--allow-runtime-lora-updating`` (or without
    ``--enable-lora``) they answer 404 saying how to turn them on."""
    def registry():
        if state.lora_registry is None:
            raise APIError(404, "LoRA is not enabled on this server: start it with --enable-lora "
                                "--allow-runtime-lora-updating", code="lora_not_enabled")
        if not state.settings.allow_runtime_lora_updating:
            raise APIError(404, "Runtime LoRA updating is off: start the server with --allow-runtime-lora-updating "
                                "(or VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)", code="runtime_lora_updating_disabled")
        return state.lora_registry

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> Response:
        adapters = registry()
        if body.load_inplace:
            raise InvalidRequestError("load_inplace is not supported: unload the adapter, then load it again",
                                      param="load_inplace")
        if body.lora_name in state.served_names:
            raise InvalidRequestError(f"The name '{body.lora_name}' is the base model's; choose another lora_name",
                                      param="lora_name")
        from kvserve.lora.peft_adapter import LoRAAdapterError

        try:  # reads the folder's config and tensor headers: off the event loop
            await asyncio.to_thread(adapters.add, body.lora_name, body.lora_path)
        except LoRAAdapterError as exc:
            raise InvalidRequestError(f"LoRA adapter '{body.lora_name}' cannot be loaded: {exc.message}",
                                      param="lora_path") from None
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="lora_name") from None
        return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.", media_type="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> Response:
        adapters = registry()
        found = adapters.get(body.lora_name)
        if found is None or (body.lora_int_id is not None and body.lora_int_id != found.lora_int_id):
            raise APIError(404, f"The lora adapter '{body.lora_name}' cannot be found.", code="lora_not_found",
                           param="lora_name")
        adapters.remove(body.lora_name)
        return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.", media_type="text/plain")


def _add_tokenizer_routes(app: FastAPI, state: ServingState) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        state.check_model(body.model)
        tokenizer = state.engine.tokenizer
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequestError("give exactly one of 'prompt' or 'messages'", param="prompt")
        if body.messages is not None:
            check_generation_prompt(body)
            token_ids = await asyncio.to_thread(render_messages, state, body)
        else:  # on a worker thread: a long text must not stall the event loop
            token_ids = await asyncio.to_thread(tokenize_prompt, tokenizer, body.prompt,
                                                add_special_tokens=body.add_special_tokens is not False)
        # vLLM: the vocabulary's pieces ("Ġworld", "▁the"), not decoded text
        strs = tokenizer.convert_ids_to_tokens(token_ids) if body.return_token_strs else None
        return TokenizeResponse(count=len(token_ids), max_model_len=state.engine.max_model_len,
                                tokens=token_ids, token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        state.check_model(body.model)
        check_token_ids(body.tokens, state.engine.vocab_size, param="tokens")
        return DetokenizeResponse(prompt=state.engine.tokenizer.decode(body.tokens))


def _add_docs_routes(app: FastAPI, state: ServingState) -> None:
    """``/openapi.json``, ``/docs`` (Swagger UI) and ``/redoc``, behind the API key when one is set
    (a browser cannot send the key: use ``curl -H "Authorization: Bearer ..."``, or
    ``--disable-fastapi-docs`` to drop them)."""
    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> JSONResponse:
        schema = dict(app.openapi())
        root = request.scope.get("root_path", "").rstrip("/")
        if root:
            schema["servers"] = [{"url": root}]
        return JSONResponse(schema)

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> Response:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(openapi_url=root + "/openapi.json", title="kvserve - Swagger UI")

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_redoc_html(openapi_url=root + "/openapi.json", title="kvserve - ReDoc")


__all__ = ["build_app"]
