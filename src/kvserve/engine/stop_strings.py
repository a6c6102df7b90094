"""Stop strings: cut the streamed text at the first stop string, never showing any part of it.

Text arrives in deltas (from the incremental detokenizer, one per engine step). A stop string can
span deltas, or end inside one, so the matcher holds back the longest pending suffix that could
still grow into a stop string::

    emitted so far | pending text            (stop = ["</answer>"])
    "The result"   | " is 4</ans"   ──► emit " is 4", hold "</ans"
                   | "</ans" + "wer> ok"    ──► hit: emit "", stop_reason "</answer>"

On a hit the text before the stop string is emitted (plus the stop string itself with
``include_stop_str_in_output``); what follows it is dropped. ``flush`` releases the held text when
generation ends without a hit.

Which stop string wins is vLLM v1's rule (``check_stop_strings`` in
``vllm/v1/engine/detokenizer.py``): an occurrence counts only if it ends in the new delta; the
stop strings are tried in the order the request lists them, and the first one that occurs wins at
its first such occurrence (not the one that ends first: with ``stop=["b", "a"]`` a delta ``"ab"``
stops at ``"b"`` and shows ``"a"``).

``add(delta, check=False)`` takes text that must not stop generation (vLLM checks no stop string
until ``min_tokens`` tokens exist); a stop string that starts in such text and ends in a later,
checked delta still counts, as in vLLM.
"""

from __future__ import annotations

from typing import NamedTuple


class StopCheck(NamedTuple):
    """What one ``add`` (or ``flush``) allows.

    Attributes:
        text: text that may be sent to the client now (may be ``""``).
        stop: the stop string that was hit, or None.
    """

    text: str
    stop: str | None


class StopStringMatcher:
    """Incremental stop-string matching for one output stream.

    Args:
        stop: the stop strings, in the request's order (non-empty strings; an empty list makes
            the matcher a pass-through).
        include_stop_str_in_output: emit the stop string itself at a hit.

    Raises:
        ValueError: an empty stop string (the input processor refuses those from clients first).
    """

    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False):
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.stop = list(dict.fromkeys(stop))
        self.include_stop_str_in_output = include_stop_str_in_output
        self._pending = ""
        self.stopped: str | None = None

    @property
    def held_text(self) -> str:
        """Text received but not emitted, because it may be the start of a stop string."""
        return self._pending

    def add(self, delta: str, check: bool = True) -> StopCheck:
        """Feed new text; return what may be emitted and whether a stop string was hit.

        Args:
            delta: the new text.
            check: False for text that cannot stop generation yet (before ``min_tokens``): it is
                emitted (less a suffix that may start a stop string) and never hits.

        After a hit the stream is over: further calls return ``StopCheck("", stop)`` again.
        Cost: O(len(held + delta) * number of stop strings) for the search, plus
        O(sum of squared stop lengths) for the hold-back.
        """
        if self.stopped is not None:
            return StopCheck("", self.stopped)
        if not self.stop:
            return StopCheck(delta, None)
        text = self._pending + delta
        hit = self._first_hit(text, len(self._pending)) if check else None
        if hit is not None:
            start, stop = hit
            self.stopped = stop
            self._pending = ""
            end = start + len(stop) if self.include_stop_str_in_output else start
            return StopCheck(text[:end], stop)
        keep = self._partial_suffix_length(text)
        self._pending = text[len(text) - keep:]
        return StopCheck(text[:len(text) - keep], None)

    def flush(self) -> StopCheck:
        """Generation ended (EOS, length, stop token): release the held text."""
        if self.stopped is not None:
            return StopCheck("", self.stopped)
        text, self._pending = self._pending, ""
        return StopCheck(text, None)

    def _first_hit(self, text: str, new_start: int) -> tuple[int, str] | None:
        """(start, stop) of the first stop string, in list order, that occurs in ``text`` ending
        after ``new_start`` (where the new delta begins); its first such occurrence."""
        if new_start == len(text):
            return None
        for stop in self.stop:
            start = text.find(stop, max(0, new_start - len(stop) + 1))
            if start >= 0:
                return start, stop
        return None

    def _partial_suffix_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
