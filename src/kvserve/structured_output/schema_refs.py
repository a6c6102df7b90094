"""``$ref`` checks of a JSON Schema, so that no constraint is silently dropped:

* a reference outside the schema (``http://...``, ``other.json#/x``) is refused: kvserve never
  fetches one, and the backends would otherwise compile it as "any value";
* a schema whose every instance would be infinite (``{"$ref": "#"}``, an object that requires a
  property of its own type) is refused: it has no JSON text, and the backends answered ``""``.

A value is *finite* when some instance of it can be written: a primitive type, ``enum``/``const``,
an object whose required properties are finite, an array that may be empty or whose items are
finite, ``anyOf``/``oneOf`` with a finite branch, ``allOf`` with all finite. Following a local
``$ref`` back into itself proves nothing on that path. Keywords not named here are assumed to
allow a finite value, so the check only refuses what it can prove.
"""

from __future__ import annotations

from typing import Any

from kvserve.structured_output.errors import StructuredOutputError

_PRIMITIVES = frozenset({"string", "number", "integer", "boolean", "null"})


def check_refs(schema: Any, param: str) -> None:
    """Raises StructuredOutputError (400): a remote ``$ref``, or a schema with no finite instance."""
    remote = next(_remote_refs(schema), None)
    if remote is not None:
        raise StructuredOutputError(
            f"{param}: the JSON schema's $ref {remote!r} points outside the schema; remote references are "
            "not fetched: put the referenced schema in $defs and refer to it as '#/$defs/NAME'", param=param)
    if not _finite(schema, schema, frozenset()):
        raise StructuredOutputError(
            f"{param}: the JSON schema has no finite instance (a $ref that requires itself without a base case); "
            "make the recursive property optional or give it an alternative", param=param)


def _remote_refs(node: Any):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            yield ref
        for value in node.values():
            yield from _remote_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _remote_refs(value)


def _resolve(root: Any, ref: str) -> Any:
    """The node a local ``#/a/b`` pointer names, or None (an unresolvable pointer is the metaschema
    check's and the backend's to refuse)."""
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _finite(node: Any, root: Any, following: frozenset[str]) -> bool:
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):  # a pointer (an anchor: not followed)
        if ref in following:
            return False
        target = _resolve(root, ref)
        if target is not None and not _finite(target, root, following | {ref}):
            return False
    if "enum" in node or "const" in node:
        return True
    for key, combine in (("anyOf", any), ("oneOf", any), ("allOf", all)):
        branches = node.get(key)
        if isinstance(branches, list) and branches and not combine(_finite(b, root, following) for b in branches):
            return False
    types = node.get("type")
    types = {types} if isinstance(types, str) else set(types or ())
    if not types or types & _PRIMITIVES:
        return _object_finite(node, root, following) if "properties" in node and not types else True
    if "object" in types and _object_finite(node, root, following):
        return True
    return "array" in types and _array_finite(node, root, following)


def _object_finite(node: dict, root: Any, following: frozenset[str]) -> bool:
    properties = node.get("properties") or {}
    return all(_finite(properties.get(name, True), root, following) for name in node.get("required") or ())


def _array_finite(node: dict, root: Any, following: frozenset[str]) -> bool:
    if not node.get("minItems") and not node.get("prefixItems"):
        return True
    items = [*(node.get("prefixItems") or ()), node.get("items", True)]
    return all(_finite(item, root, following) for item in items)
