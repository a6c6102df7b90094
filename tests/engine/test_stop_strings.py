"""Stop strings against vLLM v1's rule applied to the whole text, with deltas split anywhere."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.engine.stop_strings import StopCheck, StopStringMatcher
from kvserve.testing.tokenizer_kinds import build_tokenizer


def run(stop, deltas, include=False, unchecked=0):
    """Feed ``deltas`` (the first ``unchecked`` with ``check=False``, as before ``min_tokens``);
    return (emitted chunks, stop hit). Flushes when no stop was hit."""
    matcher = StopStringMatcher(stop, include)
    chunks, hit = [], None
    for i, delta in enumerate(deltas):
        check = matcher.add(delta, check=i >= unchecked)
        chunks.append(check.text)
        if check.stop is not None:
            hit = check.stop
            break
    if hit is None:
        chunks.append(matcher.flush().text)
    return chunks, hit


def reference(stop, deltas, include=False, unchecked=0):
    """vLLM v1 (``check_stop_strings`` after each step's text is appended to the whole output):
    each stop string, in list order, is searched from ``len(stop) - 1`` characters before the new
    text; the first found wins at its first occurrence there. Deltas before ``unchecked`` are
    never searched (``min_tokens``: vLLM moves its search start past their text)."""
    text = ""
    for i, delta in enumerate(deltas):
        text += delta
        if i < unchecked or not delta:
            continue
        for s in stop:
            start = text.find(s, max(0, len(text) - len(delta) - len(s) + 1))
            if start >= 0:
                return (text[:start + len(s)] if include else text[:start]), s
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


def test_overlapping_candidates_list_order_wins():
    """Several stop strings complete in one delta: the first in the request's list wins, at its
    first occurrence, as vLLM (not the one that ends first)."""
    assert run(["abcd", "bc"], ["xab", "cd"]) == (["x", ""], "abcd")
    assert run(["bc", "abcd"], ["xab", "cd"]) == (["x", "a"], "bc")
    assert run(["b", "a"], ["xab"]) == (["xa"], "b")
    assert run(["a", "b"], ["xab"]) == (["x"], "a")
    # One at a time, the one completed first stops generation first.
    assert run(["abc", "bcd"], ["zab", "cdx"]) == (["z", ""], "abc")
    assert run(["abc", "ab"], ["xa", "b", "c"]) == (["x", ""], "ab")
    assert run(["abc", "ab"], ["xa", "bc"]) == (["x", ""], "abc")


def test_unchecked_text_never_stops_but_can_start_a_stop_string():
    """Before ``min_tokens`` nothing stops; a stop string that starts there and ends in checked
    text counts; one wholly inside unchecked text does not (vLLM's ``stop_check_offset``)."""
    assert run(["ab"], ["xab", "y"], unchecked=1) == (["xab", "y", ""], None)
    assert run(["abc"], ["xab", "cd"], unchecked=1) == (["x", ""], "abc")
    assert run(["b", "abc"], ["ab", "x"], unchecked=1) == (["", "abx", ""], None)


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
    unchecked=st.integers(min_value=0, max_value=4),
)
def test_matches_vllm_rule_on_the_whole_text(text, stop, cuts, include, unchecked):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    chunks, hit = run(stop, deltas, include, unchecked)
    expected_text, expected_hit = reference(stop, deltas, include, unchecked)
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
