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
    chat_protocol.py, chat_parsers.py, chat_output.py   the chat request, its tool/reasoning plan,
                           its message parsed from the model's text
    tokenize_protocol.py   /tokenize and /detokenize requests

Other APIs, each translated to chat (``ChatServing.start``) and back:

    serving_responses.py   /v1/responses: responses_protocol (request), responses_input (items to
                           chat messages), responses_output / responses_objects (Response),
                           responses_events (stream events from chat chunks), responses_store (LRU)
    serving_messages.py    /v1/messages (Anthropic): anthropic_protocol (models), anthropic_request
                           (to chat), anthropic_output (message and events), anthropic_errors

Pooling models (``kvserve.pooling``):

    serving_pooling.py     /v1/embeddings, /pooling, /classify; pooling_protocol (their models)
    serving_score.py       /score, /rerank (/v1, /v2); score_protocol (their models)
"""
