"""Beam search (``kvserve.beam_search``, ``LLM.beam_search``): the search against brute force on a
small vocabulary, and the engine's search against vLLM's algorithm run on ``transformers``."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from kvserve.beam_search import BeamSearch, BeamSearchParams, beam_score
from kvserve.errors import InvalidRequestError

VOCAB, EOS, PROMPT = 4, 0, [7, 8]


def oracle(tokens: tuple[int, ...]) -> list[float]:
    """Fixed random next-token logprobs over a vocabulary of 4 for every prefix."""
    rng = random.Random(hash(tokens))
    logits = [rng.uniform(-3, 3) for _ in range(VOCAB)]
    norm = math.log(sum(math.exp(x) for x in logits))
    return [x - norm for x in logits]


def run(params: BeamSearchParams, eos: int | None) -> list[tuple[tuple[int, ...], float]]:
    search = BeamSearch(PROMPT, params, eos)
    while not search.done:
        tops = []
        for beam in search.beams:
            logprobs = oracle(tuple(beam.tokens))
            tops.append(sorted(enumerate(logprobs), key=lambda t: -t[1]))
        search.advance(tops)
    return [(tuple(search.generated(b)), b.cum_logprob) for b in search.best()]


def brute_force(length: int, eos: int | None, length_penalty: float = 1.0) -> list[tuple[tuple[int, ...], float, float]]:
    """Every sequence the search can end with: ``length`` tokens none of them EOS, or a shorter
    run of non-EOS tokens then EOS (kept without it); with its cumulative logprob and score."""
    words = [t for t in range(VOCAB) if t != eos]
    found = []
    for n in range(length + 1):
        for body in itertools.product(words, repeat=n):
            ends = [None] if n == length else ([eos] if eos is not None else [])
            for end in ends:
                cum, prefix = 0.0, tuple(PROMPT)
                for token in body + ((end,) if end is not None else ()):
                    cum += oracle(prefix)[token]
                    prefix += (token,)
                found.append((body, cum, beam_score(PROMPT + list(body), cum, eos, length_penalty)))
    return found


def test_without_pruning_the_search_is_the_exhaustive_top_k():
    # beam_width 16 >= 4**2 live prefixes and 2*16 >= 4 candidates: nothing is pruned before the end
    got = run(BeamSearchParams(beam_width=16, max_tokens=3, ignore_eos=True), eos=None)
    every = sorted(((seq, cum) for seq, cum, _ in brute_force(3, None)), key=lambda s: -s[1])
    assert [seq for seq, _ in got] == [seq for seq, _ in every[:16]]
    assert [cum for _, cum in got] == pytest.approx([cum for _, cum in every[:16]], abs=1e-12)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.5])
def test_eos_completes_beams_and_the_length_penalty_ranks_them(length_penalty):
    # 3 non-EOS words: 9 live prefixes after two steps, 27 at the third, all kept with width 27
    params = BeamSearchParams(beam_width=27, max_tokens=3, length_penalty=length_penalty)
    got = run(params, eos=EOS)
    every = sorted(brute_force(3, EOS, length_penalty), key=lambda s: -s[2])[:27]
    assert [seq for seq, _ in got] == [seq for seq, _, _ in every]
    assert any(len(seq) < 3 for seq, _ in got)  # completed beams compete with live ones


def test_pruning_keeps_the_k_best_prefixes_each_step():
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    search = BeamSearch(PROMPT, params, None)
    search.advance([sorted(enumerate(oracle(tuple(PROMPT))), key=lambda t: -t[1])])
    first = sorted(range(VOCAB), key=lambda t: -oracle(tuple(PROMPT))[t])[:2]
    assert [b.tokens[-1] for b in search.beams] == first
    assert len(search.beams[0].logprobs[0]) == VOCAB  # 2k = 4 candidates: the whole vocabulary


def test_parameters_are_checked():
    with pytest.raises(InvalidRequestError, match="n must be at most 10"):
        BeamSearchParams(beam_width=11, max_tokens=4).check()
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from kvserve import LLM

    return LLM(str(tiny_llama), max_model_len=128, dtype="float32")


@pytest.mark.parametrize("beam_width, length_penalty", [(1, 1.0), (3, 1.0), (4, 0.5)])
def test_engine_search_equals_vllms_algorithm_on_transformers(llm, tiny_llama, beam_width, length_penalty):
    import torch
    from transformers import AutoModelForCausalLM

    from kvserve.testing.reference import reference_beam_search

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32)
    prompt = llm.get_tokenizer().encode("beam search over a tiny model")
    eos = llm.get_tokenizer().eos_token_id
    params = BeamSearchParams(beam_width=beam_width, max_tokens=5, length_penalty=length_penalty)
    (out,) = llm.beam_search([{"prompt_token_ids": prompt}], params)
    expected = reference_beam_search(model, prompt, beam_width, 5, eos, length_penalty)
    assert [seq.tokens[len(prompt):] for seq in out.sequences] == [tokens for tokens, _ in expected]
    assert [seq.cum_logprob for seq in out.sequences] == pytest.approx([cum for _, cum in expected], abs=1e-4)
    assert out.sequences[0].text == llm.get_tokenizer().decode(out.sequences[0].tokens)
    assert {seq.finish_reason for seq in out.sequences} <= {"length", "stop"}


def test_beam_width_one_is_greedy(llm):
    from kvserve import SamplingParams

    prompt = "greedy is a beam of one"
    (greedy,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0))
    (beam,) = llm.beam_search(prompt, BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True))
    (seq,) = beam.sequences
    assert seq.tokens[-6:] == greedy.outputs[0].token_ids
    assert seq.cum_logprob == sum(lp.logprob for lp in greedy.outputs[0].logprobs)


def test_too_long_for_the_context_is_refused_before_running(llm):
    with pytest.raises(InvalidRequestError):
        llm.beam_search("x", BeamSearchParams(beam_width=2, max_tokens=500))
