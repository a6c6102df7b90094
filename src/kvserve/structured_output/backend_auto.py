"""The ``auto`` backend: xgrammar, or llguidance for what xgrammar cannot do (vLLM's ``auto``).

A spec goes to llguidance when its request asks for ``guidance`` (``guided_decoding_backend``),
when its JSON schema uses keywords xgrammar would not enforce, or when xgrammar rejects it and
llguidance accepts it; otherwise to xgrammar. The llguidance tokenizer is built on first need,
on the compiling thread. Both libraries share the bitmask layout, so one batch mixes them.

xgrammar is optional (its package requires ``triton``, about 1 GB that a CPU never uses:
``scripts/install.sh`` installs it without its dependencies, ``pip install kvserve[xgrammar]``
with them). Without it every spec goes to llguidance, a base dependency.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from typing import Any

import torch

# Imported for their registration side effect.
import kvserve.structured_output.backend_guidance as backend_guidance
import kvserve.structured_output.backend_xgrammar as backend_xgrammar
from kvserve.structured_output.backend import (
    CompiledGrammar,
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputsConfig,
    register_backend,
)
from kvserve.structured_output.errors import StructuredOutputError
from kvserve.structured_output.params import StructuredOutputsParams


def xgrammar_installed() -> bool:
    return importlib.util.find_spec("xgrammar") is not None


@register_backend("auto")
class AutoBackend(StructuredOutputBackend):
    """xgrammar first, llguidance where xgrammar falls short (see the module docstring)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 config: StructuredOutputsConfig):
        super().__init__(tokenizer, vocab_size, stop_token_ids, config)
        self.xgrammar = (backend_xgrammar.XgrammarBackend(tokenizer, vocab_size, stop_token_ids, config)
                         if xgrammar_installed() else None)
        self._guidance: backend_guidance.GuidanceBackend | None = None
        self._lock = threading.Lock()

    @property
    def guidance(self) -> backend_guidance.GuidanceBackend:
        """The llguidance backend, built on first use."""
        with self._lock:
            if self._guidance is None:
                self._guidance = backend_guidance.GuidanceBackend(
                    self.tokenizer, self.vocab_size, self.stop_token_ids, self.config)
            return self._guidance

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        if params.backend == "xgrammar" and self.xgrammar is None:
            raise StructuredOutputError("backend 'xgrammar' is not installed on this server; use 'guidance' or 'auto'")
        if self.xgrammar is None or params.backend == "guidance" or self.xgrammar.unsupported(params):
            return self.guidance.compile(params)
        if params.backend == "xgrammar":
            return self.xgrammar.compile(params)
        try:
            return self.xgrammar.compile(params)
        except StructuredOutputError as xgrammar_error:
            try:
                return self.guidance.compile(params)
            except StructuredOutputError:
                raise xgrammar_error from None

    def fill_bitmasks(self, rows: Sequence[tuple[StructuredOutputGrammar, int]],
                      bitmask: torch.Tensor) -> None:
        xgr_rows = [r for r in rows if isinstance(r[0], backend_xgrammar.XgrammarGrammar)]
        other = [r for r in rows if not isinstance(r[0], backend_xgrammar.XgrammarGrammar)]
        if xgr_rows:
            self.xgrammar.fill_bitmasks(xgr_rows, bitmask)
        if other:
            self.guidance.fill_bitmasks(other, bitmask)
