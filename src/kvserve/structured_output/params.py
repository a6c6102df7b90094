"""The request-side spec of a structured output: exactly one constraint plus options.

Names and meanings follow vLLM's ``vllm.sampling_params.StructuredOutputsParams``: one of
``json`` (a JSON Schema), ``regex``, ``choice``, ``grammar`` (EBNF/GBNF or Lark),
``json_object`` (any JSON object) or ``structural_tag`` (xgrammar's structural tag JSON); options
``disable_any_whitespace``, ``disable_additional_properties`` and ``whitespace_pattern``.

Two fields are kvserve's: ``backend`` keeps a request's ``guided_decoding_backend`` (vLLM's
older field) so the input processor can check it against the engine's backend, and ``source``
names the request field the spec came from, so an error about it is a 400 on that field.

The object is frozen and hashable: ``json`` is stored as the client sent it (text or dict) but
:meth:`StructuredOutputsParams.key` (the compile-cache key) uses its canonical text, which keeps
the order of object keys (property order decides the order a model must write them in).
"""

from __future__ import annotations

import enum
import json as _json
from dataclasses import dataclass, field
from typing import Any

from kvserve.structured_output.errors import StructuredOutputError

_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputKind(str, enum.Enum):
    """Which constraint a spec carries (vLLM's ``StructuredOutputOptions``)."""

    JSON = "json"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"
    STRUCTURAL_TAG = "structural_tag"


def canonical_json(value: Any) -> str:
    """Compact JSON text of ``value`` with key order kept (a cache key, not a normal form)."""
    return _json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True, eq=False)
class StructuredOutputsParams:
    """One structured-output constraint and its options, validated on construction.

    Attributes:
        json: a JSON Schema, as a dict or JSON text.
        regex: a regular expression the whole output must match.
        choice: the output is exactly one of these strings.
        grammar: a context-free grammar: EBNF/GBNF (a line with ``::=``) or Lark.
        json_object: ``True`` for any JSON object (OpenAI ``response_format: json_object``).
        structural_tag: xgrammar structural-tag JSON text (or dict).
        disable_any_whitespace: JSON without optional whitespace (compact, deterministic).
        disable_additional_properties: objects with ``properties`` get
            ``additionalProperties: false`` unless they say otherwise (guidance backend).
        whitespace_pattern: a regex for JSON whitespace (guidance backend only).
        backend: the request's ``guided_decoding_backend`` name, or ``None``.
        source: the request field this spec came from (for error messages).

    Raises:
        StructuredOutputError: none or several constraints, or a constraint of the wrong type.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    backend: str | None = None
    source: str = field(default="structured_outputs", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.json_object is False:
            object.__setattr__(self, "json_object", None)
        given = [name for name in _CONSTRAINTS if getattr(self, name) is not None]
        if len(given) != 1:
            what = "none is given" if not given else f"got {', '.join(given)}"
            raise StructuredOutputError(
                f"{self.source}: give exactly one structured-output constraint among "
                f"{', '.join(_CONSTRAINTS)}; {what}",
                param=self.source,
            )
        self._check_types()

    def _check_types(self) -> None:
        if self.json is not None and not isinstance(self.json, (str, dict)):
            self._fail("json must be a JSON Schema object (or its JSON text)")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            self._fail("regex must be a non-empty string")
        if self.grammar is not None and (
                not isinstance(self.grammar, str) or not self.grammar.strip()):
            self._fail("grammar must be a non-empty string (EBNF/GBNF or Lark)")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) for c in self.choice):
                self._fail("choice must be a non-empty list of strings")
        if self.json_object is not None and self.json_object is not True:
            self._fail("json_object must be a boolean")
        if self.structural_tag is not None and not isinstance(self.structural_tag, (str, dict)):
            self._fail("structural_tag must be a JSON object (or its JSON text)")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            self._fail("whitespace_pattern must be a string")

    def _fail(self, message: str) -> None:
        raise StructuredOutputError(f"{self.source}: {message}", param=self.source)

    @property
    def kind(self) -> StructuredOutputKind:
        """The one constraint this spec carries."""
        for name in _CONSTRAINTS:
            if getattr(self, name) is not None:
                return StructuredOutputKind(name)
        raise AssertionError("validated in __post_init__")

    def json_schema(self) -> dict | bool:
        """The JSON Schema as a Python value (``json`` parsed if it is text).

        Raises:
            StructuredOutputError: ``json`` is text that does not parse as JSON.
        """
        if isinstance(self.json, dict):
            return self.json
        try:
            return _json.loads(self.json)
        except (TypeError, ValueError) as exc:
            raise StructuredOutputError(
                f"{self.source}: the JSON schema is not valid JSON: {exc}", param=self.source
            ) from None

    def spec_text(self) -> str:
        """The constraint as text: canonical JSON for json/choice/structural_tag, else as given."""
        kind = self.kind
        if kind is StructuredOutputKind.JSON:
            return canonical_json(self.json_schema())
        if kind is StructuredOutputKind.JSON_OBJECT:
            return '{"type":"object"}'
        if kind is StructuredOutputKind.CHOICE:
            return canonical_json(list(self.choice))
        if kind is StructuredOutputKind.STRUCTURAL_TAG:
            tag = self.structural_tag
            return tag if isinstance(tag, str) else canonical_json(tag)
        return self.regex if kind is StructuredOutputKind.REGEX else self.grammar

    def key(self) -> tuple:
        """Compile-cache key: (kind, canonical spec text, options that change the grammar)."""
        return (
            self.kind.value,
            self.spec_text(),
            self.disable_any_whitespace,
            self.disable_additional_properties,
            self.whitespace_pattern,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StructuredOutputsParams):
            return NotImplemented
        return self.key() == other.key() and self.backend == other.backend

    def __hash__(self) -> int:
        return hash((self.key(), self.backend))
