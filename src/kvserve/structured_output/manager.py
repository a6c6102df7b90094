"""One engine's structured outputs: its grammar backend, built once on a background thread
(tokenizer info takes seconds, importing xgrammar's kernel a few more), and the compile service
the input processor calls for each constrained request::

    StructuredOutputManager(tokenizer, vocab, eos, config, build_now)   # returns at once
        .compile(params) ─► starts the build if not yet started, waits for the backend (first
                            request only) ─► cached / compiled grammar, or StructuredOutputError
                            (a 400, before anything is queued)

A server builds at start, while its weights load (``build_now``), so that its first constrained
request does not wait; an offline engine builds at its first constrained request, as vLLM's does:
the build (~0.5 s of CPU for a 152k vocabulary) on a 2-core machine otherwise took a core from the
first prefill step of a ``generate`` started right after the engine (1.7 s instead of 1.2 s).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kvserve.errors import ConfigError
from kvserve.structured_output.backend import CompiledGrammar, StructuredOutputsConfig, create_backend
from kvserve.structured_output.closing import closing_alphabet
from kvserve.structured_output.compiler import GrammarCompileService
from kvserve.structured_output.errors import StructuredOutputError
from kvserve.structured_output.params import StructuredOutputsParams
from kvserve.structured_output.request_fields import check_request_backend

logger = logging.getLogger(__name__)


class StructuredOutputManager:
    """Args:
    tokenizer: the model's tokenizer.
    vocab_size: logits width.
    stop_token_ids: the model's EOS ids (allowed only where a grammar may end).
    config: ``--structured-outputs-config``.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 config: StructuredOutputsConfig | None = None, build_now: bool = True):
        self.config = config or StructuredOutputsConfig()
        if self.config.backend == "xgrammar" and importlib.util.find_spec("xgrammar") is None:
            raise ConfigError("structured outputs backend 'xgrammar' needs the xgrammar package, which is not "
                              "installed: pip install --no-deps xgrammar apache-tvm-ffi (or 'kvserve[xgrammar]'), "
                              "or use the backend 'auto' or 'guidance'")
        self._build_args = (tokenizer, vocab_size, tuple(stop_token_ids))
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvserve-grammar-backend")
        self._starting = threading.Lock()
        self._service: Future | None = None
        if build_now:
            self.start_build()

    def start_build(self) -> Future:
        """The backend's build (started on the first call)."""
        with self._starting:
            if self._service is None:
                self._service = self._builder.submit(self._build, *self._build_args)
            return self._service

    def _build(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> GrammarCompileService:
        try:
            backend = create_backend(tokenizer, vocab_size, stop_token_ids, self.config)
        except Exception as exc:
            logger.error("structured outputs: the %s backend could not be built: %s", self.config.backend, exc)
            raise
        logger.info("structured outputs: %s backend ready", self.config.backend)
        return GrammarCompileService(backend)

    @functools.cached_property
    def closing_alphabet(self) -> tuple[int, ...]:
        """The single-character tokens plans to finish within ``max_tokens`` use (``closing``)."""
        return closing_alphabet(self._build_args[0])

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled grammar of ``params`` (blocking: call it off the event loop and off the
        engine thread).

        Raises:
            StructuredOutputError: a spec the backend rejects, a compile past the deadline, or a
                backend that could not be built here.
        """
        check_request_backend(params, self.config.backend)
        try:
            service = self.start_build().result()
        except Exception as exc:  # noqa: BLE001 - reported to the client, logged once by the future
            raise StructuredOutputError(f"structured outputs are not available on this server: {exc}",
                                        param=params.source) from exc
        return service.compile(params)
