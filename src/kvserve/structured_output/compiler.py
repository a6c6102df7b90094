"""Compiling specs off the caller's thread: a worker pool, an LRU cache, a deadline.

::

    submit(params) ──► cache hit? ──────────────────────────────► done future
                   └─► same key compiling? ──► share its result ─┐
                   └─► pool.submit(backend.compile) ─────────────┴─► future with a deadline:
                                                                     compiled grammar, or
                                                                     StructuredOutputError, or
                                                                     GrammarCompileTimeout

Results are cached by :meth:`StructuredOutputsParams.key` (kind + canonical spec text +
whitespace options), so a cached schema costs a dictionary lookup. Rejections are cached too (a
spec the backend refused is refused again at once). A compile that misses its deadline fails
only the requests that waited for it: it goes on in its worker, and when it finishes its result
enters the cache. Both libraries release the GIL while compiling, so the engine thread keeps
stepping meanwhile (measured: a Python loop ran at the same rate during a compile).

Interface note for the lead: build one service per backend at start; in the input processor
``await asyncio.wrap_future(service.submit(params))`` (or call :meth:`compile` from a worker
thread). Any exception it raises is a :class:`StructuredOutputError` (HTTP 400, ``param`` set);
nothing of a bad spec reaches the engine thread.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from kvserve.structured_output.backend import CompiledGrammar, StructuredOutputBackend
from kvserve.structured_output.errors import GrammarCompileTimeout, StructuredOutputError
from kvserve.structured_output.params import StructuredOutputsParams


class GrammarCompileService:
    """Thread-pool compiles with a cache and a per-request deadline.

    Args:
        backend: the model's grammar backend.
        timeout_s: deadline per request (``None``: the backend config's ``compile_timeout_s``).
        max_workers: compile threads (``None``: ``max_compile_workers`` of the config).
        cache_size: compiled grammars kept (``None``: ``cache_size`` of the config).
    """

    def __init__(self, backend: StructuredOutputBackend, *, timeout_s: float | None = None,
                 max_workers: int | None = None, cache_size: int | None = None):
        config = backend.config
        self.backend = backend
        self.timeout_s = config.compile_timeout_s if timeout_s is None else timeout_s
        self._cache_size = config.cache_size if cache_size is None else cache_size
        self._pool = ThreadPoolExecutor(
            max_workers=max_workers or config.max_compile_workers,
            thread_name_prefix="kvserve-grammar",
        )
        # Reentrant: a compile that finishes before ``submit`` registers its callback runs
        # ``_store`` at once, in ``submit``'s thread, under ``submit``'s lock (a plain Lock
        # deadlocked there).
        self._lock = threading.RLock()
        self._cache: OrderedDict[tuple, CompiledGrammar | StructuredOutputError] = OrderedDict()
        self._running: dict[tuple, Future] = {}
        self.hits = 0
        self.misses = 0

    def submit(self, params: StructuredOutputsParams) -> Future:
        """A future of the compiled grammar; never blocks. It fails with
        :class:`StructuredOutputError` (rejected) or :class:`GrammarCompileTimeout`."""
        outer: Future = Future()
        try:
            key = (params.key(), params.backend)
        except StructuredOutputError as exc:  # e.g. JSON text that does not parse
            outer.set_exception(exc)
            return outer
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                _resolve(outer, cached)
                return outer
            self.misses += 1
            inner = self._running.get(key)
            if inner is None:
                inner = self._pool.submit(self.backend.compile, params)
                self._running[key] = inner
                inner.add_done_callback(lambda done, key=key: self._store(key, done))
        timer = threading.Timer(self.timeout_s, _expire, (outer, params, self.timeout_s))
        timer.daemon = True
        timer.start()
        inner.add_done_callback(lambda done: (timer.cancel(), _copy(done, outer)))
        return outer

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """Blocking :meth:`submit` (for a worker thread or tests); raises its error."""
        return self.submit(params).result()

    def _store(self, key: tuple, done: Future) -> None:
        if done.cancelled():
            with self._lock:
                self._running.pop(key, None)
            return
        error = done.exception()
        value = done.result() if error is None else error
        with self._lock:
            self._running.pop(key, None)
            if error is not None and not isinstance(error, StructuredOutputError):
                return  # unexpected failures are not cached: the next request retries
            if self._cache_size > 0:
                self._cache[key] = value
                self._cache.move_to_end(key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)

    def cached(self, params: StructuredOutputsParams) -> bool:
        """Whether ``params`` is in the cache (compiled or rejected)."""
        with self._lock:
            return (params.key(), params.backend) in self._cache

    def shutdown(self) -> None:
        """Stop accepting compiles; running ones finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _resolve(future: Future, value: CompiledGrammar | BaseException) -> None:
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)


def _copy(done: Future, outer: Future) -> None:
    if outer.done():
        return
    error = (StructuredOutputError("grammar compilation was cancelled (server shutting down)")
             if done.cancelled() else done.exception())
    if error is not None and not isinstance(error, StructuredOutputError):
        error = StructuredOutputError(f"grammar compilation failed: {error}")
    try:
        _resolve(outer, error if error is not None else done.result())
    except Exception:  # lost the race against the deadline
        pass


def _expire(outer: Future, params: StructuredOutputsParams, timeout_s: float) -> None:
    if outer.done():
        return
    try:
        outer.set_exception(GrammarCompileTimeout(
            f"{params.source}: compiling this {params.kind.value} took longer than the "
            f"{timeout_s:g} s limit",
            param=params.source,
        ))
    except Exception:  # lost the race against the result
        pass
