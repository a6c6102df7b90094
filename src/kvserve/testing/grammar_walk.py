"""Random walks through a grammar: test support for structured outputs and forced tool calls.

Used by the tests of :mod:`kvserve.structured_output` and :mod:`kvserve.tool_parsers`; the walk
replaces a random-weight model (any allowed token is a possible model choice).

:func:`random_walk` samples a token uniformly among the tokens the bitmask allows (half of the
steps among the one-character punctuation tokens and EOS, so that walks end), and returns the
tokens and whether the grammar terminated.
"""

from __future__ import annotations

import torch

from kvserve.structured_output.bitmask import token_ban_mask


def allowed_ids(bitmask: torch.Tensor, row: int, vocab_size: int) -> list[int]:
    """Token ids whose bit is set in ``bitmask[row]`` (reference: bit arithmetic in Python)."""
    words = bitmask[row].tolist()
    return [t for t in range(vocab_size) if (words[t // 32] >> (t % 32)) & 1]


def allowed_fast(bitmask: torch.Tensor, row: int, vocab_size: int) -> list[int]:
    return (~token_ban_mask(bitmask[row:row + 1], vocab_size, torch.device("cpu"))[0]
            ).nonzero().flatten().tolist()


def random_walk(backend, compiled, seed: int, max_steps: int = 120):
    """``(tokens without the final EOS, terminated)`` of one walk."""
    generator = torch.Generator().manual_seed(seed)
    grammar = compiled.new_grammar()
    bitmask = backend.allocate_token_bitmask(1)
    stops = torch.zeros(backend.vocab_size, dtype=torch.bool)
    stops[list(backend.stop_token_ids)] = True
    short = punctuation_mask(backend.tokenizer, backend.vocab_size) | stops
    tokens: list[int] = []
    for _ in range(max_steps):
        bitmask.fill_(-1)
        backend.fill_bitmasks([(grammar, 0)], bitmask)
        allowed = ~token_ban_mask(bitmask, backend.vocab_size, torch.device("cpu"))[0]
        assert allowed.any(), "a live grammar always allows some token"
        coin = torch.rand((), generator=generator).item()
        if coin < 0.25 and (allowed & stops).any():
            pool = allowed & stops
        elif coin < 0.6 and (allowed & short).any():
            pool = allowed & short
        else:
            pool = allowed
        choices = pool.nonzero().flatten()
        pick = int(choices[torch.randint(len(choices), (), generator=generator)])
        assert grammar.accept_tokens([pick])
        if grammar.is_terminated():
            assert stops[pick]
            return tokens, True
        tokens.append(pick)
    return tokens, False


_PUNCT: dict[tuple[int, int], torch.Tensor] = {}


def punctuation_mask(tokenizer, vocab_size: int) -> torch.Tensor:
    """``bool [vocab_size]``: tokens that decode to one non-alphanumeric, non-space character."""
    key = (id(tokenizer), vocab_size)
    if key not in _PUNCT:
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        hits = [i for i, t in enumerate(texts)
                if len(t) == 1 and not t.isalnum() and not t.isspace()]
        mask[hits] = True
        _PUNCT[key] = mask
    return _PUNCT[key]
