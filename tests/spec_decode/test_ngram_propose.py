"""``ngram_propose`` against a brute-force reference: every earlier position tried, the longest
match of at most ``max_n`` tokens, the most recent among equally long ones."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvserve.spec_decode.ngram_proposer import ngram_propose


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    length, best_n, best_end = len(tokens), 0, -1
    for end in range(length - 1):  # an earlier occurrence ending at ``end``
        n = 0
        while n < max_n and end - n >= 0 and tokens[end - n] == tokens[length - 1 - n]:
            n += 1
        if n >= best_n and n > 0:
            best_n, best_end = n, end  # ``>=``: a later one of equal length wins
    if best_n < min_n:
        return []
    return tokens[best_end + 1 : best_end + 1 + k]


def test_examples():
    a, b, c, d, e = 10, 11, 12, 13, 14
    assert ngram_propose(np.array([a, b, c, d, a, b, c]), 2, 3, 4).tolist() == [d, a, b, c]
    # "b c" occurs twice before the end: the most recent one's continuation
    assert ngram_propose(np.array([b, c, d, e, b, c, a, b, c]), 2, 2, 2).tolist() == [a, b]
    # a longer match wins over a more recent shorter one
    assert ngram_propose(np.array([a, b, c, d, e, b, c, e, a, b, c]), 2, 3, 1).tolist() == [d]
    assert ngram_propose(np.array([a, b, c, d]), 1, 3, 4).tolist() == []
    assert ngram_propose(np.array([a, b, a, c]), 2, 3, 4).tolist() == []  # "a c" never occurred
    assert ngram_propose(np.array([a]), 1, 3, 4).tolist() == []


@pytest.mark.parametrize("seed", range(4))
def test_equals_brute_force(seed):
    rng = random.Random(seed)
    for _ in range(300):
        vocab = rng.choice([2, 3, 5, 20])
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        max_n = rng.randint(1, 6)
        min_n, k = rng.randint(1, max_n), rng.randint(1, 8)
        got = ngram_propose(np.array(tokens, dtype=np.int64), min_n, max_n, k).tolist()
        assert got == brute_force(tokens, min_n, max_n, k), (tokens, min_n, max_n, k)
