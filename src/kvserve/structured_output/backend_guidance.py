"""The guidance backend: llguidance (Earley parser + lazy lexer, resource limits per step).

Per model: one ``llguidance.LLTokenizer`` (built once, ~2.5 s for a 152k vocabulary). Per spec
(as vLLM's ``backend_guidance.py``): JSON Schema through ``grammar_from_json_schema`` with
``whitespace_flexible`` off when whitespace is disabled (llguidance then writes ``,`` and ``:``
with no spaces, xgrammar writes ``, `` and ``: ``), ``regex``/``choice``/``grammar`` (Lark or
GBNF) through ``llguidance.grammar_from``, ``structural_tag`` in the ``{"structures",
"triggers"}`` format. A spec is validated and a template matcher built once (llguidance drops
the GIL while building its lexer); requests get ``deep_copy()`` of it. Masks are computed with
the numpy helpers (the torch ones compile with inductor on first use).
"""

from __future__ import annotations

import copy
import json
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
from kvserve.structured_output.config import JSON_WHITESPACE_REGEX
from kvserve.structured_output.errors import StructuredOutputError
from kvserve.structured_output.params import StructuredOutputKind, StructuredOutputsParams
from kvserve.structured_output.schema_check import check_json_schema, unsupported_features

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("additionalProperties", "items", "prefixItems", "allOf", "anyOf", "oneOf", "not",
               "if", "then", "else", "contains", "propertyNames", "unevaluatedProperties")


def close_additional_properties(schema: Any) -> Any:
    """A copy of ``schema`` where each object with ``properties``/``patternProperties`` and no
    ``additionalProperties`` gets ``additionalProperties: false`` (vLLM's
    ``disable_additional_properties``)."""
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend(node[key].values())
        stack.extend(node[key] for key in _SUBSCHEMAS if isinstance(node.get(key), (dict, list)))
        has_props = isinstance(node.get("properties"), dict) or isinstance(
            node.get("patternProperties"), dict)
        if has_props and "additionalProperties" not in node:
            node["additionalProperties"] = False
    return schema


class GuidanceGrammar(StructuredOutputGrammar):
    """One request's ``llguidance.LLMatcher``."""

    def __init__(self, matcher: Any, stop_token_ids: frozenset[int]):
        super().__init__(matcher)
        self._stop = stop_token_ids

    def accept_tokens(self, tokens: Sequence[int]) -> bool:
        for token in tokens:
            if self._terminated:
                return True
            token = int(token)
            if token in self._stop:
                # llguidance stops by itself once only EOS may follow, and then validates no
                # token; EOS is ours to accept wherever the grammar may end. It is not fed to
                # the matcher, so rollback skips it.
                if not self._matcher.is_accepting():
                    return False
                self._terminated = True
            elif self._matcher.validate_tokens([token]) != 1:
                return False  # checked first: a refused token would poison the matcher
            else:
                self._matcher.consume_token(token)
            self._count += 1
        return True

    def validate_tokens(self, tokens: Sequence[int]) -> list[int]:
        if self._terminated or not tokens:
            return []
        tokens = [int(t) for t in tokens]
        return tokens[: self._matcher.validate_tokens(tokens)]

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        fed = num_tokens - 1 if self._terminated else num_tokens
        if fed:
            self._matcher.rollback(fed)
        self._count -= num_tokens
        self._terminated = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        import llguidance.numpy as llg_numpy

        llg_numpy.fill_next_token_bitmask(self._matcher, bitmask.numpy(), row)


class GuidanceCompiled(CompiledGrammar):
    """A validated llguidance grammar and a template matcher at its start state."""

    def __init__(self, template: Any, stop_token_ids: frozenset[int]):
        self._template = template
        self._stop = stop_token_ids

    def new_grammar(self) -> GuidanceGrammar:
        return GuidanceGrammar(self._template.deep_copy(), self._stop)


@register_backend("guidance")
class GuidanceBackend(StructuredOutputBackend):
    """llguidance bound to one model (see the module docstring)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 config: StructuredOutputsConfig):
        super().__init__(tokenizer, vocab_size, stop_token_ids, config)
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        self.ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=self.vocab_size, eos_token=list(self.stop_token_ids)
        )
        self._executor = llguidance.LLExecutor(num_threads=config.max_compile_workers)
        self._stop = frozenset(self.stop_token_ids)

    def compile(self, params: StructuredOutputsParams) -> GuidanceCompiled:
        self.spec_text(params)  # the size check; llguidance takes the grammar it serializes
        try:
            grammar = self.serialize(params)
        except StructuredOutputError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise self._error(params, str(exc)) from None
        error = self._llg.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        if error:
            raise self._error(params, error)
        template = self._llg.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if template.is_error():
            raise self._error(params, template.get_error())
        return GuidanceCompiled(template, self._stop)

    def _error(self, params: StructuredOutputsParams, message: str) -> StructuredOutputError:
        first = next((line for line in message.splitlines() if line.strip()), message)
        return StructuredOutputError(
            f"{params.source}: llguidance cannot compile this {params.kind.value}: {first}",
            param=params.source,
        )

    def serialize(self, params: StructuredOutputsParams) -> str:
        """The llguidance grammar text for ``params`` (not yet validated)."""
        llg = self._llg
        kind = params.kind
        compact = params.disable_any_whitespace or self.config.disable_any_whitespace
        defaults: dict[str, Any] = {"whitespace_flexible": not compact}
        if params.whitespace_pattern is not None:
            defaults["whitespace_pattern"] = params.whitespace_pattern
        elif not compact:  # flexible, but bounded (llama.cpp's rule)
            defaults["whitespace_pattern"] = JSON_WHITESPACE_REGEX
        if kind is StructuredOutputKind.JSON:
            schema = params.json_schema()
            check_json_schema(schema, params.source)
            problems = unsupported_features(schema, "guidance")
            if problems:
                raise StructuredOutputError(
                    f"{params.source}: the JSON schema uses features llguidance does not "
                    f"support: {', '.join(problems)}",
                    param=params.source,
                )
            if params.disable_additional_properties or self.config.disable_additional_properties:
                schema = close_additional_properties(schema)
            return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=defaults)
        if kind is StructuredOutputKind.JSON_OBJECT:
            return llg.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=defaults)
        if kind is StructuredOutputKind.REGEX:
            return llg.grammar_from("regex", params.regex)
        if kind is StructuredOutputKind.CHOICE:
            return llg.grammar_from("choice", json.dumps(list(params.choice)))
        if kind is StructuredOutputKind.GRAMMAR:
            return llg.grammar_from("grammar", params.grammar)
        return self._structural_tag(json.loads(params.spec_text()), defaults)

    def _structural_tag(self, tag: Any, defaults: dict[str, Any]) -> str:
        llg = self._llg
        if not isinstance(tag, dict) or "structures" not in tag or "triggers" not in tag:
            raise ValueError("the guidance backend takes structural tags as "
                             "{structures: [{begin, schema, end}], triggers: [...]}")
        tags = []
        for item in tag["structures"]:
            trigger = next((t for t in tag["triggers"] if item["begin"].startswith(t)), None)
            if trigger is None:
                raise ValueError(f"no trigger in {tag['triggers']} starts {item['begin']!r}")
            schema = llg.LLMatcher.grammar_from_json_schema(
                json.dumps(item.get("schema", {})), defaults=defaults)
            tags.append(llg.StructTag(trigger=trigger, begin=item["begin"], grammar=schema,
                                      end=item["end"]))
        if not tags:
            raise ValueError("structural_tag has no structures")
        return llg.StructTag.to_grammar(tags)

    def fill_bitmasks(self, rows: Sequence[tuple[StructuredOutputGrammar, int]],
                      bitmask: torch.Tensor) -> None:
        """All rows on llguidance's thread pool (one call, GIL released)."""
        if not rows:
            return
        import llguidance.numpy as llg_numpy

        pairs = [(grammar._matcher, row) for grammar, row in rows]  # noqa: SLF001
        llg_numpy.fill_next_token_bitmask_par(self._executor, pairs, bitmask.numpy())
