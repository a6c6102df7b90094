"""Stop strings against a character-by-character reference, with deltas split anywhere."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.engine.stop_strings import StopCheck, StopStringMatcher
from kvserve.testing.tokenizer_kinds import build_tokenizer


def run(stop, deltas, include=False):
    """Feed ``deltas``; return (emitted chunks, stop hit). Flushes when no stop was hit."""
    matcher = StopStringMatcher(stop, include)
    chunks, hit = [], None
    for delta in deltas:
        check = matcher.add(delta)
        chunks.append(check.text)
        if check.stop is not None:
            hit = check.stop
            break
    if hit is None:
        chunks.append(matcher.flush().text)
    return chunks, hit


def reference(stop, text, include=False):
    """Stream one character at a time and stop at the first prefix that ends with a stop string
    (the longest one when several end there)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stop if text[:end].endswith(s)]
        if done:
            hit = max(done, key=len)
            return (text[:end] if include else text[:end - len(hit)]), hit
    return text, None


def test_stop_string_ending_mid_delta():
    chunks, hit = run(["world"], ["Hello wor", "ld!! more"])
    assert chunks == ["Hello ", ""] and hit == "world"


def test_stop_string_spanning_deltas_is_never_leaked():
    chunks, hit = run(["</answer>"], ["It is 4", "</", "ans", "wer> and more"])
    assert chunks == ["It is 4", "", "", ""] and hit == "</answer>"
    # A false start is released as soon as it cannot be a stop string any more.
    chunks, hit = run(["</answer>"], ["a</an", "t> b"])
    assert chunks == ["a", "</ant> b", ""] and hit is None


def test_overlapping_candidates_first_completed_wins():
    assert run(["abcd", "bc"], ["xab", "cd"]) == (["x", "a"], "bc")
    assert run(["abc", "bcd"], ["zab", "cdx"]) == (["z", ""], "abc")
    assert run(["ab", "abc"], ["xa", "bc"]) == (["x", ""], "ab")
    # Same end: the longer (earlier start) one wins, so less text is shown.
    assert run(["bc", "abc"], ["xabc"]) == (["x"], "abc")


def test_include_stop_str_in_output():
    assert run(["STOP"], ["go ST", "OP now"], include=True) == (["go ", "STOP"], "STOP")


def test_no_stop_strings_pass_through_and_flush_releases_held_text():
    assert run([], ["a", "b"]) == (["a", "b", ""], None)
    matcher = StopStringMatcher(["###"])
    assert matcher.add("text ##") == StopCheck("text ", None)
    assert matcher.held_text == "##"
    assert matcher.flush() == StopCheck("##", None)


def test_calls_after_a_hit_emit_nothing():
    matcher = StopStringMatcher(["x"])
    assert matcher.add("axb") == StopCheck("a", "x")
    assert matcher.add("more") == StopCheck("", "x")
    assert matcher.flush() == StopCheck("", "x")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc d", max_size=40),
    stop=st.lists(st.text(alphabet="abc d", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
    include=st.booleans(),
)
def test_matches_character_by_character_reference(text, stop, cuts, include):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    chunks, hit = run(stop, deltas, include)
    expected_text, expected_hit = reference(stop, text, include)
    assert hit == expected_hit
    assert "".join(chunks) == expected_text


def test_with_detokenized_tokens_stop_inside_a_token():
    tokenizer = build_tokenizer("bpe")
    text = "The answer is 42. Thank you for asking"
    ids = tokenizer.encode(text, add_special_tokens=False)
    boundaries = {len(tokenizer.decode(ids[:i])) for i in range(len(ids) + 1)}
    start = text.index("nk yo")
    # "nk yo" starts and ends inside tokens: no token boundary at either end.
    assert start not in boundaries and start + len("nk yo") not in boundaries
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    chunks, hit = run(["nk yo", "zzz"], [detokenizer.add_tokens([t]) for t in ids])
    assert "".join(chunks) == "The answer is 42. Tha" and hit == "nk yo"
