"""Reference decoding with ``transformers`` for tests: what greedy decoding gives when some
tokens may not come next (``allowed_token_ids``, ``bad_words``), and vLLM's beam search, computed
from the reference model's full-sequence logits with no kvserve code involved."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def reference_greedy(model: Any, prompt_token_ids: list[int], max_tokens: int,
                     banned_at: Callable[[list[int]], Iterable[int]] | None = None) -> list[int]:
    """Greedy decoding with a ``transformers`` causal LM, one full forward pass per token.

    Args:
        model: e.g. ``AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)``.
        prompt_token_ids: the prompt.
        max_tokens: tokens to generate (EOS does not stop it).
        banned_at: ``generated token ids -> ids that may not come next`` (their logits become
            -inf before the argmax), or None.

    Returns:
        The generated token ids.
    """
    import torch

    ids = list(prompt_token_ids)
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float().clone()
        banned = list(banned_at(ids[len(prompt_token_ids):])) if banned_at is not None else []
        if banned:
            logits[banned] = float("-inf")
        ids.append(int(logits.argmax()))
    return ids[len(prompt_token_ids):]


def single_token_word(tokenizer: Any, token_ids: list[int]) -> tuple[int, str]:
    """``(position, word)`` of the first token in ``token_ids`` that is a whole word by itself:
    its text, spaces stripped, encodes back to just that token.

    Raises:
        AssertionError: there is none.
    """
    for position, token in enumerate(token_ids):
        text = tokenizer.decode([token])
        if "\ufffd" not in text and text.strip() and tokenizer.encode(text.lstrip(), add_special_tokens=False) == [token]:
            return position, text.strip()
    raise AssertionError(f"no single-token word in {token_ids}")


def vllm_bad_word_sequences(tokenizer: Any, word: str) -> list[list[int]]:
    """vLLM's token sequences of one bad word, spelled out independently of
    ``kvserve.sample.bad_words``: the word as is (leading spaces removed), plus with one leading
    space when that gives a different first token and the same length."""
    plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
    spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
    return [plain] + ([spaced] if spaced[0] != plain[0] and len(spaced) == len(plain) else [])


def bad_words_ban(sequences: list[list[int]]) -> Callable[[list[int]], set[int]]:
    """A ``banned_at`` for :func:`reference_greedy`: the last token of each sequence whose other
    tokens end the generated ones (a one-token sequence always)."""

    def banned_at(generated: list[int]) -> set[int]:
        return {s[-1] for s in sequences
                if len(s) == 1 or (len(generated) >= len(s) - 1 and generated[len(generated) - len(s) + 1:] == s[:-1])}

    return banned_at


def reference_beam_search(model: Any, prompt_token_ids: list[int], beam_width: int, max_tokens: int,
                          eos_token_id: int | None, length_penalty: float = 1.0) -> list[tuple[list[int], float]]:
    """vLLM 0.32's online beam search (``vllm/entrypoints/generate/beam_search/online.py``) over a
    ``transformers`` causal LM, one full forward pass per beam and step, float64 sums.

    Returns:
        ``(generated token ids, cumulative logprob)`` of the ``beam_width`` best, best first (a
        beam that ended with EOS without it).
    """
    import torch

    def score(tokens: list[int], cum: float) -> float:
        return cum / (max(len(tokens), 1) ** length_penalty)  # ended beams hold no EOS token

    beams: list[tuple[list[int], float]] = [(list(prompt_token_ids), 0.0)]
    completed: list[tuple[list[int], float]] = []
    for _ in range(max_tokens):
        candidates = []
        for tokens, cum in beams:
            with torch.no_grad():
                logprobs = torch.log_softmax(model(torch.tensor([tokens])).logits[0, -1].float(), dim=-1)
            top = torch.topk(logprobs, 2 * beam_width)
            for token_id, logprob in zip(top.indices.tolist(), top.values.tolist()):
                if token_id == eos_token_id:
                    completed.append((tokens, cum + logprob))
                else:
                    candidates.append((cum + logprob, tokens + [token_id]))
        candidates.sort(key=lambda c: -c[0])
        beams = [(tokens, cum) for cum, tokens in candidates[:beam_width]]
        if not beams:
            break
    pool = sorted(completed + beams, key=lambda b: -score(*b))[:beam_width]
    return [(tokens[len(prompt_token_ids):], cum) for tokens, cum in pool]
