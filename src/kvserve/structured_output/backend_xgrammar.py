"""The xgrammar backend (default): pushdown automata with a precomputed token cache.

Per model: ``xgrammar.TokenizerInfo`` (built once, ~1 s for a 152k vocabulary) and a
``GrammarCompiler``. Per spec, as vLLM's ``backend_xgrammar.py`` maps them: JSON Schema and
``json_object`` through ``Grammar.from_json_schema`` (``any_whitespace`` off when whitespace is
disabled, else llama.cpp's whitespace rule put in place of xgrammar's, see
:func:`llama_cpp_whitespace`), ``regex`` through ``compile_regex``, ``choice`` as an EBNF alternation of string
literals, ``grammar`` as Lark when no line has ``::=`` else EBNF/GBNF, ``structural_tag`` in
either xgrammar's current format or the older ``{"structures", "triggers"}`` one. Schemas with
keywords xgrammar would silently ignore are refused (see :mod:`.schema_check`).
xgrammar releases the GIL while compiling and filling masks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import torch

from kvserve.structured_output.backend import (
    CompiledGrammar,
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputsConfig,
    register_backend,
)
from kvserve.structured_output.config import JSON_WHITESPACE_EBNF, MAX_JSON_WHITESPACE
from kvserve.structured_output.errors import StructuredOutputError
from kvserve.structured_output.grammar_text import choice_to_ebnf, is_lark_grammar
from kvserve.structured_output.params import StructuredOutputKind, StructuredOutputsParams
from kvserve.structured_output.schema_check import check_json_schema, unsupported_features


class XgrammarGrammar(StructuredOutputGrammar):
    """One request's ``xgrammar.GrammarMatcher``."""

    def accept_tokens(self, tokens: Sequence[int]) -> bool:
        for token in tokens:
            if self._terminated:
                return True
            if not self._matcher.accept_token(int(token)):
                return False
            self._count += 1
            self._terminated = self._matcher.is_terminated()
        return True

    def validate_tokens(self, tokens: Sequence[int]) -> list[int]:
        accepted: list[int] = []
        for token in tokens:
            if self._terminated or self._matcher.is_terminated():
                break
            if not self._matcher.accept_token(int(token)):
                break
            accepted.append(int(token))
        if accepted:
            self._matcher.rollback(len(accepted))
        return accepted

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        self._matcher.rollback(num_tokens)
        self._count -= num_tokens
        self._terminated = self._matcher.is_terminated()

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)


class XgrammarCompiled(CompiledGrammar):
    """An ``xgrammar.CompiledGrammar`` (immutable, shared by all its matchers)."""

    def __init__(self, compiled: Any):
        self.compiled = compiled

    def new_grammar(self) -> XgrammarGrammar:
        import xgrammar

        return XgrammarGrammar(xgrammar.GrammarMatcher(self.compiled))


@register_backend("xgrammar")
class XgrammarBackend(StructuredOutputBackend):
    """xgrammar bound to one model (see the module docstring)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 config: StructuredOutputsConfig):
        super().__init__(tokenizer, vocab_size, stop_token_ids, config)
        try:
            import xgrammar
        except ImportError:
            raise ValueError("the xgrammar structured outputs backend needs the xgrammar package: "
                             "pip install 'kvserve[xgrammar]' (or pip install --no-deps xgrammar apache-tvm-ffi)") from None

        self._xgr = xgrammar
        self.tokenizer_info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(self.stop_token_ids)
        )
        self._compiler = xgrammar.GrammarCompiler(
            self.tokenizer_info, max_threads=config.max_compile_workers, cache_enabled=False
        )
        self._batch = xgrammar.BatchGrammarMatcher(max_threads=config.max_compile_workers)

    def unsupported(self, params: StructuredOutputsParams) -> list[str]:
        """Schema features xgrammar would not enforce ([] for other kinds)."""
        if params.kind is not StructuredOutputKind.JSON:
            return []
        return unsupported_features(params.json_schema(), "xgrammar")

    def compile(self, params: StructuredOutputsParams) -> XgrammarCompiled:
        text = self.spec_text(params)
        try:
            compiled = self._compile(params, text)
        except StructuredOutputError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError/its own types
            raise StructuredOutputError(
                f"{params.source}: xgrammar cannot compile this {params.kind.value}: "
                f"{_first_line(exc)}",
                param=params.source,
            ) from None
        return XgrammarCompiled(compiled)

    def _compile(self, params: StructuredOutputsParams, text: str) -> Any:
        kind = params.kind
        compact = params.disable_any_whitespace or self.config.disable_any_whitespace
        if kind is StructuredOutputKind.JSON:
            check_json_schema(params.json_schema(), params.source)
            problems = self.unsupported(params)
            if problems:
                raise StructuredOutputError(
                    f"{params.source}: the JSON schema uses features xgrammar does not enforce: "
                    f"{', '.join(problems)} (serve with the guidance or auto backend)",
                    param=params.source,
                )
            return self._compile_json(text, compact)
        if kind is StructuredOutputKind.JSON_OBJECT:
            return self._compile_json('{"type": "object"}', compact)
        if kind is StructuredOutputKind.REGEX:
            if "\x00" in text:
                raise StructuredOutputError(
                    f"{params.source}: the regex must not contain a NUL character",
                    param=params.source,
                )
            return self._compiler.compile_regex(text)
        if kind is StructuredOutputKind.CHOICE:
            return self._compiler.compile_grammar(choice_to_ebnf(params.choice))
        if kind is StructuredOutputKind.GRAMMAR:
            if is_lark_grammar(text):
                return self._compiler.compile_lark(text)
            return self._compiler.compile_grammar(text)
        return self._compile_structural_tag(text)

    def _compile_structural_tag(self, text: str) -> Any:
        tag = json.loads(text)
        if isinstance(tag, dict) and "structures" in tag:
            items = [
                self._xgr.StructuralTagItem(
                    begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"]
                )
                for s in tag["structures"]
            ]
            return self._compiler.compile_structural_tag(items, tag["triggers"])
        return self._compiler.compile_structural_tag(text)

    def fill_bitmasks(self, rows: Sequence[tuple[StructuredOutputGrammar, int]],
                      bitmask: torch.Tensor) -> None:
        """One call into xgrammar's thread pool for all rows (GIL released)."""
        if not rows:
            return
        matchers = [grammar._matcher for grammar, _ in rows]  # noqa: SLF001 (same module family)
        self._batch.batch_fill_next_token_bitmask(
            matchers, bitmask, indices=[row for _, row in rows]
        )


    def _compile_json(self, schema: str, compact: bool) -> Any:
        if compact:
            return self._compiler.compile_json_schema(schema, any_whitespace=False)
        grammar = self._xgr.Grammar.from_json_schema(schema, any_whitespace=True,
                                                     max_whitespace_cnt=MAX_JSON_WHITESPACE)
        return self._compiler.compile_grammar(llama_cpp_whitespace(self._xgr, grammar))


def llama_cpp_whitespace(xgr: Any, grammar: Any) -> Any:
    """``grammar`` (xgrammar's from a JSON schema, whitespace runs ``[ \n\r\t]{0, N}``) with each
    run replaced by llama.cpp's rule (``JSON_WHITESPACE_EBNF``: nothing, a space, or a newline and
    up to N spaces or tabs), so a weak model cannot fill ``max_tokens`` with newlines.

    Raises:
        RuntimeError: xgrammar's printed grammar has no whitespace run of the expected shape (a
            changed xgrammar; the unit test of this function catches it).
    """
    text, count = re.subn(rf"whitespace(?:_\d+)?\{{0, {MAX_JSON_WHITESPACE}\}}", "json_whitespace", str(grammar))
    if count == 0:
        raise RuntimeError("xgrammar's JSON grammar has no bounded whitespace runs to replace")
    return xgr.Grammar.from_ebnf(f"{text}\njson_whitespace ::= {JSON_WHITESPACE_EBNF}\n", root_rule_name="root")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if len(lines) > 1 and "Check failed" in lines[0] else lines[0]
