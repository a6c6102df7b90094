"""``kvserve route``: a cache- and load-aware gateway in front of OpenAI-compatible workers
(kvserve, vLLM, SGLang, llama.cpp), and the routing behind ``kvserve serve --data-parallel-size N``.

    config.py          RouterConfig (flags -> one frozen dataclass)
    registry.py        the worker registry file and the model registry (YAML)
    worker.py          one worker: health, circuit breaker, in-flight count, scraped load,
                       KV-event index and approximate prefix index
    circuit_breaker.py closed -> open -> half-open -> closed
    prefix.py          request block hashes (as the worker hashes) and the approximate index
    policies.py        RoutingPolicy interface + registry: round_robin, power_of_two,
                       least_load, cache_aware (the cost formula)
    fleet.py           the workers, their model, standby pool, drain, selection
    monitor.py         active health checks and /metrics scraping (load)
    proxy.py           forwarding: retries before the first byte, byte-for-byte streams,
                       in-band errors for broken streams
    scaling.py         desired_replicas and the windows behind it
    metrics.py         the router's Prometheus series
    app.py             the FastAPI app (OpenAI routes, /health, /metrics, /workers)
    launcher.py        ``kvserve route`` and ``kvserve serve -dp N``
"""
