"""The OpenAI-compatible HTTP layer (FastAPI + uvicorn) in front of an ``EngineClient``.

    settings.py            ServerSettings (frozen) and the server's command-line flags
    protocol.py            request models and their conversion to SamplingParams
    responses.py           response, stream-chunk, model-list and tokenizer models
    server.py              build_app(engine, settings) -> FastAPI: the routes
    serving_completion.py  /v1/completions        serving_chat.py  /v1/chat/completions
    serving_base.py        shared state, model/context checks, admission, disconnect watch
    logprobs.py            TokenLogprobs in the completions and chat formats
    tokenization.py        prompts, chat templates, token strings/bytes
    sse.py                 server-sent events and a disconnect-aware streaming response
    errors.py              OpenAI error bodies and the exception handlers
    auth.py                Bearer API keys            rate_limit.py  per-key token buckets
    middleware.py          X-Request-Id (request_id_of), body size and read-time limits
    http_protocol.py       uvicorn's h11 protocol with a request-header deadline
    run.py                 serve(engine, settings): uvicorn with a draining SIGTERM
    launcher.py            run_server(args) for ``kvserve serve``: bind, check, load, announce
"""
