"""Finishing a constrained output within ``max_tokens``: near the end of its budget, a request is
steered to the shortest way out of its grammar, so a weak model that writes a string value until
``max_tokens`` still ends with valid JSON (``finish_reason`` ``stop``) instead of a cut document.
No peer does this: vLLM, SGLang and llama.cpp return the truncated text (``length``).

When ``remaining`` tokens (``max_tokens`` minus the output so far) drop to ``LOOKAHEAD``, the
logits processor asks :func:`closing_token` for the next token of a short token sequence after
which the grammar accepts its stop token; once ``remaining <= len(plan) + SLACK`` (the plan ends with the stop
token), the row is masked to the plan's next token. ``SLACK`` covers steps where no plan exists
(the model stopped inside a multi-byte character, which the single-character alphabet cannot
finish) and the model's own step before the plan starts. Before that the model writes freely, so an output that
ends by itself within the budget is untouched (and so is every output of a request with
``ignore_eos``, which does not end at the grammar's end).

The search walks single-character tokens (``CLOSING_CHARACTERS``, structural ones first) with the
request's own matcher, accepting and rolling back, so every plan is one the grammar allows:

1. iterative deepening over ``" } ] , : 0`` up to ``SHORT_DEPTH`` tokens (``"}`` closes a string
   value and its object, ``]`` an array);
2. else a depth-first walk over the whole alphabet, structural characters first, up to
   ``MAX_DEPTH`` tokens and ``MAX_STEPS`` accept attempts (a missing required key is spelled
   character by character).

Each step of a row in its last ``LOOKAHEAD`` tokens asks :func:`closing_token`, which runs the
cheap depth-first walk first and the deepening only once the budget is that walk's length plus
``SLACK`` or less.

No plan (a grammar the alphabet cannot finish, or one too deep): the model goes on as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvserve.structured_output.backend import StructuredOutputGrammar

CLOSING_CHARACTERS = ('"}],:0' + "123456789" + "tfn" + "abcdeghijklmopqrsuvwxyz"
                      + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "-_.{[ ")
SHORT = 6  # the structural characters the short search uses (the first of CLOSING_CHARACTERS)
SHORT_DEPTH = 4
MAX_DEPTH = 64
MAX_STEPS = 4000
LOOKAHEAD = 64  # plans are looked for from this many remaining tokens on
SLACK = 6  # tokens of the budget a plan starts before it must
_ANCHOR = "a"  # text the alphabet's tokens are decoded after


def closing_alphabet(tokenizer: Any) -> tuple[int, ...]:
    """The token ids of ``CLOSING_CHARACTERS`` that the tokenizer spells with one token, in that
    order (characters it does not are left out).

    A token counts when it adds exactly its character after other text (``decode([a, token])``
    is ``decode([a])`` plus the character): a SentencePiece tokenizer encodes ``"}"`` alone as
    ``"▁}"``, which decodes to ``"}"`` at the start of a text but writes ``" }"`` anywhere else.
    """
    anchor = tokenizer.encode(_ANCHOR, add_special_tokens=False)
    anchor_text = tokenizer.decode(anchor)
    ids: list[int] = []
    for char in CLOSING_CHARACTERS:
        for token in _candidates(tokenizer, char, anchor):
            if token not in ids and tokenizer.decode([*anchor, token]) == anchor_text + char:
                ids.append(token)
                break
    return tuple(ids)


def _candidates(tokenizer: Any, char: str, anchor: list[int]) -> list[int]:
    """Token ids that may spell ``char`` alone: its encoding when that is one token, the
    vocabulary entry named ``char``, and the token ``char`` adds after the anchor."""
    found = []
    encoded = tokenizer.encode(char, add_special_tokens=False)
    if len(encoded) == 1:
        found.append(encoded[0])
    named = tokenizer.convert_tokens_to_ids(char)
    if isinstance(named, int):
        found.append(named)
    after = tokenizer.encode(_ANCHOR + char, add_special_tokens=False)
    if len(after) == len(anchor) + 1 and after[:-1] == anchor:
        found.append(after[-1])
    return found


def closing_plan(matcher: StructuredOutputGrammar, alphabet: Sequence[int],
                 stop_token_ids: Sequence[int]) -> list[int] | None:
    """Tokens after which ``matcher`` accepts a stop token, that stop token last: the shortest
    over the structural characters, else the first depth-first path; None when no such path is
    found. The matcher is left as it was."""
    return _shortest_plan(matcher, alphabet, stop_token_ids) or _any_plan(matcher, alphabet, stop_token_ids)


def closing_token(matcher: StructuredOutputGrammar, alphabet: Sequence[int], stop_token_ids: Sequence[int],
                  remaining: int) -> int | None:
    """The next token of :func:`closing_plan` once no more than its length plus ``SLACK`` tokens
    are ``remaining``; else None. The depth-first path comes first (a few matcher steps where a way
    out exists): while even it leaves room, the budget needs no plan yet, and the iterative
    deepening (every string of up to ``SHORT_DEPTH`` structural characters, about 1,500 matcher
    steps inside a string) is not run."""
    found = _any_plan(matcher, alphabet, stop_token_ids)
    if found is None or remaining > len(found) + SLACK:
        return None
    plan = _shortest_plan(matcher, alphabet, stop_token_ids) or found
    return plan[0] if remaining <= len(plan) + SLACK else None


def _shortest_plan(matcher: StructuredOutputGrammar, alphabet: Sequence[int],
                   stop_token_ids: Sequence[int]) -> list[int] | None:
    search = _Search(matcher, stop_token_ids)
    for depth in range(SHORT_DEPTH + 1):
        if search.deepening(list(alphabet[:SHORT]), depth):
            return search.done()
    return None


def _any_plan(matcher: StructuredOutputGrammar, alphabet: Sequence[int],
              stop_token_ids: Sequence[int]) -> list[int] | None:
    search = _Search(matcher, stop_token_ids)
    return search.done() if search.depth_first(list(alphabet), MAX_DEPTH) else None


class _Search:
    def __init__(self, matcher: StructuredOutputGrammar, stop_token_ids: Sequence[int]):
        self.matcher = matcher
        self.stop_token_ids = stop_token_ids
        self.path: list[int] = []
        self.steps = 0
        self.stop: int | None = None

    def can_stop(self) -> bool:
        for stop in self.stop_token_ids:
            if self.matcher.accept_tokens([stop]) and self.matcher.is_terminated():
                self.matcher.rollback(1)
                self.stop = stop
                return True
        return False

    def done(self) -> list[int]:
        """The path found and its stop token; the matcher is taken back to where the search began."""
        if self.path:
            self.matcher.rollback(len(self.path))
        return [*self.path, self.stop]

    def _push(self, token: int) -> bool:
        self.steps += 1
        if self.matcher.is_terminated() or not self.matcher.accept_tokens([token]):
            return False
        self.path.append(token)
        return True

    def _pop(self) -> None:
        self.path.pop()
        self.matcher.rollback(1)

    def deepening(self, alphabet: list[int], depth: int) -> bool:
        """A path of exactly ``depth`` more tokens (every shorter one was tried before)."""
        if depth == 0:
            return self.can_stop()
        for token in alphabet:
            if self._push(token):
                if self.deepening(alphabet, depth - 1):
                    return True
                self._pop()
        return False

    def depth_first(self, alphabet: list[int], depth: int) -> bool:
        if self.can_stop():
            return True
        if depth == 0:
            return False
        for token in alphabet:
            if self.steps >= MAX_STEPS:
                return False
            if self._push(token):
                if self.depth_first(alphabet, depth - 1):
                    return True
                self._pop()
        return False
