"""One engine's structured outputs: its grammar backend, built once on a background thread at
start (tokenizer info takes seconds, importing xgrammar's kernel a few more), and the compile
service the input processor calls for each constrained request::

    StructuredOutputManager(tokenizer, vocab, eos, config)   # returns at once; builds meanwhile
        .compile(params) ─► waits for the backend (first request only) ─► cached / compiled
                            grammar, or StructuredOutputError (a 400, before anything is queued)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kvserve.structured_output.backend import CompiledGrammar, StructuredOutputsConfig, create_backend
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
                 config: StructuredOutputsConfig | None = None):
        self.config = config or StructuredOutputsConfig()
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvserve-grammar-backend")
        self._service: Future = self._builder.submit(self._build, tokenizer, vocab_size, tuple(stop_token_ids))

    def _build(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> GrammarCompileService:
        backend = create_backend(tokenizer, vocab_size, stop_token_ids, self.config)
        logger.info("structured outputs: %s backend ready", self.config.backend)
        return GrammarCompileService(backend)

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled grammar of ``params`` (blocking: call it off the event loop and off the
        engine thread).

        Raises:
            StructuredOutputError: a spec the backend rejects, a compile past the deadline, or a
                backend that could not be built here.
        """
        check_request_backend(params, self.config.backend)
        try:
            service = self._service.result()
        except Exception as exc:  # noqa: BLE001 - reported to the client, logged once by the future
            raise StructuredOutputError(f"structured outputs are not available on this server: {exc}",
                                        param=params.source) from exc
        return service.compile(params)
