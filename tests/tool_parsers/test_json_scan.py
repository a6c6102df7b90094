"""The incremental JSON object scanner against the standard library's ``json``: complete and
valid exactly when ``json.loads`` accepts the object, every prefix of a valid text is error-free,
member spans decode to the members' values, and any split of the text gives the same state."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.tool_parsers.json_scan import JsonObjectScanner

scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=8)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=5), inner, max_size=3), max_leaves=12)
objects = st.dictionaries(st.text(max_size=6), values, max_size=4)
layouts = st.sampled_from([{}, {"separators": (",", ":")}, {"indent": 2}, {"ensure_ascii": False}])


def scan(text: str, cuts=()) -> JsonObjectScanner:
    scanner = JsonObjectScanner(0)
    for cut in sorted(cuts):
        scanner.feed(text[:cut])
    scanner.feed(text)
    return scanner


@settings(max_examples=200, deadline=None)
@given(objects, layouts, st.lists(st.integers(0, 400), max_size=6))
def test_valid_objects_scan_completely_and_members_decode(obj, layout, cuts):
    text = json.dumps(obj, **layout)
    scanner = scan(text, [c for c in cuts if c <= len(text)])
    assert scanner.done and not scanner.error and scanner.end == len(text)
    assert [m.key for m in scanner.members] == list(obj)
    for member in scanner.members:
        assert json.loads(text[member.value_start:member.value_end]) == obj[member.key]
    for cut in range(len(text)):
        prefix = scan(text[:cut])
        assert not prefix.error and not prefix.done


@settings(max_examples=300, deadline=None)
@given(objects, st.integers(0, 10**6), st.sampled_from(list(',:{}[]"\\ 0-e.tnx\x01')),
       st.booleans())
def test_mutated_texts_agree_with_json_loads(obj, where, char, insert):
    text = json.dumps(obj)
    i = where % (len(text) + 1)
    mutated = text[:i] + char + text[i + (0 if insert else 1):]
    try:
        loaded = json.loads(mutated)
        valid = isinstance(loaded, dict)
    except ValueError:
        valid = False
    scanner = scan(mutated)
    complete = scanner.done and not scanner.error and mutated[scanner.end:].strip() == ""
    assert complete == valid, mutated
