"""Checks of a JSON Schema before a grammar backend sees it.

* :func:`check_json_schema`: the schema must be a valid JSON Schema (the ``jsonschema``
  library's metaschema check for the draft the schema declares, 2020-12 by default) and within
  size and nesting limits, with no remote ``$ref`` and some finite instance (:mod:`.schema_refs`).
* :func:`unsupported_features`: keywords a backend would silently ignore, so its output could
  break the schema. The lists are the facts vLLM records in ``backend_xgrammar.py``
  (``has_xgrammar_unsupported_json_features``) and ``backend_guidance.py``
  (``has_guidance_unsupported_json_features``), plus one measured here: xgrammar 0.2.9 turns
  a string with ``minLength``/``maxLength`` into a character class that lets raw control
  characters through (its random-walk outputs failed ``json.loads``). The ``xgrammar``
  backend refuses such a schema with a 400; ``auto`` sends it to ``guidance`` instead.
"""

from __future__ import annotations

from typing import Any

from kvserve.structured_output.errors import StructuredOutputError
from kvserve.structured_output.schema_refs import check_refs

# String formats xgrammar compiles (xgrammar's json_schema_converter).
XGRAMMAR_STRING_FORMATS = frozenset(
    {
        "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
        "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer",
    }
)
MAX_SCHEMA_DEPTH = 64


def check_json_schema(schema: Any, param: str) -> None:
    """Raise a 400 unless ``schema`` is a valid JSON Schema of reasonable depth.

    Raises:
        StructuredOutputError: not an object/boolean, nested deeper than
            :data:`MAX_SCHEMA_DEPTH`, or invalid against its metaschema (message from
            ``jsonschema``).
    """
    import jsonschema

    if not isinstance(schema, (dict, bool)):
        raise StructuredOutputError(
            f"{param}: a JSON Schema must be an object or a boolean; got {type(schema).__name__}",
            param=param,
        )
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise StructuredOutputError(
            f"{param}: the JSON schema is nested deeper than {MAX_SCHEMA_DEPTH} levels", param=param
        )
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise StructuredOutputError(
            f"{param}: invalid JSON schema at {where}: {exc.message}", param=param
        ) from None
    check_refs(schema, param)


def _depth(value: Any) -> int:
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_SCHEMA_DEPTH:
            return deepest
        children = node.values() if isinstance(node, dict) else (
            node if isinstance(node, list) else ())
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _types(node: dict) -> set[str]:
    kind = node.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()


def _has_pattern_and_length(node: Any) -> bool:
    return (
        isinstance(node, dict)
        and ("pattern" in node or "format" in node)
        and ("minLength" in node or "maxLength" in node)
    )


def _xgrammar_problems(node: dict) -> list[str]:
    types = _types(node)
    found = []
    if types & {"integer", "number"} and "multipleOf" in node:
        found.append("multipleOf")
    if "array" in types:
        found += [k for k in ("uniqueItems", "contains", "minContains", "maxContains") if k in node]
    if "string" in types:
        fmt = node.get("format")
        if fmt is not None and fmt not in XGRAMMAR_STRING_FORMATS:
            found.append(f"format {fmt!r}")
        if _has_pattern_and_length(node):
            found.append("pattern/format together with minLength/maxLength")
        elif "minLength" in node or "maxLength" in node:
            # Measured with xgrammar 0.2.9: a length-bounded string becomes [^"\\\r\n]{m,n},
            # which admits raw control characters (invalid JSON) and no escapes.
            found.append("minLength/maxLength on strings")
    if "object" in types:
        if _has_pattern_and_length(node.get("propertyNames")):
            found.append("propertyNames with pattern/format and a length bound")
        if "propertyNames" in node and (
            "properties" in node
            or "patternProperties" in node
            or isinstance(node.get("additionalProperties"), dict)
            or node.get("unevaluatedProperties", True) is not True
        ):
            found.append("propertyNames together with properties/additionalProperties")
        pattern_props = node.get("patternProperties")
        if isinstance(pattern_props, dict) and ("properties" in node or len(pattern_props) > 1):
            found.append("patternProperties with properties or with several patterns")
    return found


def _guidance_problems(node: dict) -> list[str]:
    return ["patternProperties"] if "patternProperties" in node else []


def unsupported_features(schema: Any, backend: str) -> list[str]:
    """Schema features ``backend`` (``xgrammar`` or ``guidance``) does not enforce; [] if none."""
    check = _xgrammar_problems if backend == "xgrammar" else _guidance_problems
    found: list[str] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found += check(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return sorted(set(found))
