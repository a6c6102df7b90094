"""Request fields to one :class:`StructuredOutputsParams`: pure functions for the input processor.

Accepted forms (field names and meanings as in OpenAI's API reference and vLLM's
``ChatCompletionRequest`` / ``CompletionRequest``):

================================  ========================================================
``response_format``               ``{"type": "text"}`` (no constraint), ``{"type":
                                  "json_object"}``, ``{"type": "json_schema", "json_schema":
                                  {"name", "schema", "strict", "description"}}``, or vLLM's
                                  ``{"type": "structural_tag", ...}``
``structured_outputs``            vLLM's object: ``json``, ``regex``, ``choice``, ``grammar``,
                                  ``json_object``, ``structural_tag``, ``disable_any_whitespace``,
                                  ``disable_additional_properties``, ``whitespace_pattern``
``guided_json`` ...               vLLM's older fields ``guided_json``, ``guided_regex``,
                                  ``guided_choice``, ``guided_grammar``,
                                  ``guided_whitespace_pattern``, ``guided_decoding_backend``
================================  ========================================================

At most one constraint may be given over all of them (vLLM refuses two kinds as well); each
mistake is a :class:`StructuredOutputError` naming the field and what is allowed. ``strict`` is
accepted and has no effect: kvserve always enforces the schema.

Interface note for the lead: call :func:`structured_outputs_from_request` once per request in
the input processor with the raw (JSON-decoded) field values; ``None`` means unconstrained.
Then :func:`check_request_backend` against the engine's configured backend, and
``backend.validate(params)`` / the compile service, so a bad spec is a 400 before queuing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from kvserve.structured_output.errors import StructuredOutputError
from kvserve.structured_output.params import StructuredOutputsParams

_OPTION_FIELDS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
_CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_LEGACY_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
BACKEND_NAMES = ("auto", "xgrammar", "guidance")


def _as_mapping(value: Any, param: str) -> Mapping:
    if hasattr(value, "model_dump"):
        value = value.model_dump(by_alias=True, exclude_none=True)
    if not isinstance(value, Mapping):
        raise StructuredOutputError(f"{param} must be an object", param=param)
    return value


def constraint_from_response_format(response_format: Any) -> tuple[str, Any] | None:
    """``(constraint field, value)`` from OpenAI's ``response_format``, or ``None`` for text.

    Raises:
        StructuredOutputError: unknown ``type``, or a ``json_schema`` without its schema/name.
    """
    if response_format is None:
        return None
    rf = _as_mapping(response_format, "response_format")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ("json_object", True)
    if kind == "json_schema":
        return ("json", _schema_of(rf.get("json_schema")))
    if kind == "structural_tag":
        return ("structural_tag", json.dumps(dict(rf), ensure_ascii=False))
    raise StructuredOutputError(
        f"response_format.type must be one of text, json_object, json_schema, structural_tag; "
        f"got {kind!r}",
        param="response_format",
    )


def _schema_of(json_schema: Any) -> Any:
    param = "response_format.json_schema"
    if json_schema is None:
        raise StructuredOutputError(
            "response_format of type json_schema needs a json_schema object with name and schema",
            param=param,
        )
    js = _as_mapping(json_schema, param)
    name = js.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise StructuredOutputError(
            f"{param}.name must be 1-64 characters of a-z, A-Z, 0-9, _ or -; got {name!r}",
            param=f"{param}.name",
        )
    if "strict" in js and js["strict"] is not None and not isinstance(js["strict"], bool):
        raise StructuredOutputError(f"{param}.strict must be a boolean", param=f"{param}.strict")
    schema = js.get("schema")
    if not isinstance(schema, dict):
        raise StructuredOutputError(
            f"{param}.schema must be a JSON Schema object; got {type(schema).__name__}",
            param=f"{param}.schema",
        )
    return schema


def _parse_legacy_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise StructuredOutputError(
                f"guided_json is not valid JSON: {exc}", param="guided_json"
            ) from None
    return value


def _gather(response_format: Any, structured_outputs: Any, legacy: Mapping[str, Any]):
    """All (source field, constraint field, value) given, and the options."""
    found: list[tuple[str, str, Any]] = []
    options: dict[str, Any] = {}
    if structured_outputs is not None:
        so = _as_mapping(structured_outputs, "structured_outputs")
        unknown = sorted(set(so) - set(_CONSTRAINT_FIELDS) - set(_OPTION_FIELDS))
        if unknown:
            allowed = ", ".join(_CONSTRAINT_FIELDS + _OPTION_FIELDS)
            raise StructuredOutputError(
                f"structured_outputs has unknown field(s) {', '.join(unknown)}; allowed: {allowed}",
                param="structured_outputs",
            )
        for name in _CONSTRAINT_FIELDS:
            value = so.get(name)
            if value is not None and not (name == "json_object" and value is False):
                found.append(("structured_outputs", name, value))
        options.update({k: so[k] for k in _OPTION_FIELDS if so.get(k) is not None})
    for legacy_name, name in _LEGACY_FIELDS.items():
        value = legacy.get(legacy_name)
        if value is not None:
            if legacy_name == "guided_json":
                value = _parse_legacy_json(value)
            found.append((legacy_name, name, value))
    from_rf = constraint_from_response_format(response_format)
    if from_rf is not None:
        found.append(("response_format", *from_rf))
    if legacy.get("guided_whitespace_pattern") is not None:
        options["whitespace_pattern"] = legacy["guided_whitespace_pattern"]
    return found, options


def structured_outputs_from_request(
    *,
    response_format: Any = None,
    structured_outputs: Any = None,
    guided_json: Any = None,
    guided_regex: Any = None,
    guided_choice: Any = None,
    guided_grammar: Any = None,
    guided_whitespace_pattern: Any = None,
    guided_decoding_backend: Any = None,
) -> StructuredOutputsParams | None:
    """The one structured-output spec of a request, or ``None`` when unconstrained.

    Args:
        response_format: OpenAI's field (dict or pydantic model), or ``None``.
        structured_outputs: vLLM's object (dict or pydantic model), or ``None``.
        guided_json, guided_regex, guided_choice, guided_grammar, guided_whitespace_pattern,
        guided_decoding_backend: vLLM's older fields.

    Raises:
        StructuredOutputError: two constraints, a malformed one, or options without a constraint.
    """
    legacy = {
        "guided_json": guided_json,
        "guided_regex": guided_regex,
        "guided_choice": guided_choice,
        "guided_grammar": guided_grammar,
        "guided_whitespace_pattern": guided_whitespace_pattern,
    }
    found, options = _gather(response_format, structured_outputs, legacy)
    backend = _backend_name(guided_decoding_backend)
    if len(found) > 1:
        named = ", ".join(f"{src}.{name}" if src == "structured_outputs" else src
                          for src, name, _ in found)
        raise StructuredOutputError(
            f"give at most one structured-output constraint (response_format, structured_outputs "
            f"or a guided_* field); got {named}",
            param=found[1][0],
        )
    if not found:
        if structured_outputs is not None:
            raise StructuredOutputError(
                f"structured_outputs needs one of {', '.join(_CONSTRAINT_FIELDS)}",
                param="structured_outputs",
            )
        return None
    source, name, value = found[0]
    return StructuredOutputsParams(**{name: value}, **options, backend=backend, source=source)


def _backend_name(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise StructuredOutputError(
            "guided_decoding_backend must be a string", param="guided_decoding_backend"
        )
    name = value.split(":", 1)[0].strip()  # vLLM's older "xgrammar:no-fallback" option syntax
    if name not in BACKEND_NAMES:
        raise StructuredOutputError(
            f"guided_decoding_backend must be one of {', '.join(BACKEND_NAMES)}; got {value!r}",
            param="guided_decoding_backend",
        )
    return name


def check_request_backend(params: StructuredOutputsParams, engine_backend: str) -> None:
    """Refuse a request-level backend other than the engine's (as vLLM V1 does).

    ``auto`` on either side accepts any; the engine builds one backend per model at start.

    Raises:
        StructuredOutputError: the request names another backend than the engine serves.
    """
    wanted = params.backend
    if wanted is None or wanted == "auto" or engine_backend == "auto" or wanted == engine_backend:
        return
    raise StructuredOutputError(
        f"guided_decoding_backend {wanted!r} is not served: this server's structured-output "
        f"backend is {engine_backend!r} (leave the field out, or use 'auto' or "
        f"{engine_backend!r})",
        param="guided_decoding_backend",
    )
