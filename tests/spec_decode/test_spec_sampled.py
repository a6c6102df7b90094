"""Sampled speculative decoding: each position's token has the non-speculative distribution, and
a seeded request gives exactly its non-speculative tokens (and logprob bits) whatever else is in
the batch and whichever drafts it verified.

Why exactly: a seeded request draws one uniform per token from its own generator and a position's
token is the inverse-CDF draw of the target distribution there; a draft is accepted when that
draw equals it (rejection sampling with a point-mass draft; ``kvserve.spec_decode
.rejection_sampler``). The chi-square test checks the distribution itself, on unseeded requests
restricted to a tiny vocabulary, against probabilities computed from the model's logits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kvserve import SamplingParams
from kvserve.testing.spec_decode import ForcedProposer, reference_drafts
from spec_helpers import NGRAM, copy_prompts, generate_checked, make_llm, results, spec_stats

PROMPTS = copy_prompts(5, seed=21)
SEEDED = [
    SamplingParams(temperature=1.0, seed=1, max_tokens=20, ignore_eos=True, logprobs=1),
    SamplingParams(temperature=0.7, top_p=0.9, seed=2, max_tokens=20, ignore_eos=True, logprobs=0),
    SamplingParams(temperature=1.3, top_k=40, min_p=0.01, seed=3, max_tokens=20, ignore_eos=True),
    SamplingParams(temperature=0.5, seed=2**63 - 1, max_tokens=20, ignore_eos=True, repetition_penalty=1.2),
    SamplingParams(temperature=1.0, seed=5, n=2, max_tokens=20, ignore_eos=True, logprobs=2),
]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    return results(make_llm(tiny_llama).generate(PROMPTS, SEEDED))


def reference_map(ref) -> dict:
    return {tuple(p): r[0][0] for p, r in zip(PROMPTS, ref)}


@pytest.mark.parametrize("mode", ["all", "prefix", "none"])
def test_seeded_requests_give_their_plain_tokens_whatever_the_drafts(tiny_llama, reference, mode):
    llm = make_llm(tiny_llama, speculative_config=NGRAM)
    llm.llm_engine.core.proposer = ForcedProposer(reference_drafts(reference_map(reference), 4, mode))
    got = results(generate_checked(llm, PROMPTS, SEEDED))
    assert [r[:1] for r in got] == [r[:1] for r in reference]  # the choice the drafts follow
    assert got == reference  # and the n = 2 sibling
    stats = spec_stats(llm)
    if mode == "all":  # every draft but the n = 2 sibling's (drafted from choice 0) is accepted
        assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens > 0.5 * stats.num_draft_tokens
    elif mode == "none":
        assert stats.num_accepted_tokens == 0


def test_seeded_request_is_the_same_alone_and_in_any_batch(tiny_llama):
    seeded = SamplingParams(temperature=0.9, seed=77, max_tokens=24, ignore_eos=True, logprobs=1)
    noise = [SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True),
             SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
             SamplingParams(temperature=0.6, seed=1, max_tokens=30, ignore_eos=True)]
    llm = make_llm(tiny_llama, speculative_config=NGRAM)
    alone = results(llm.generate([PROMPTS[0]], seeded))[0]
    for others in (noise[:1], noise, noise[::-1]):
        prompts = [PROMPTS[0]] + PROMPTS[1 : 1 + len(others)]
        got = results(llm.generate(prompts, [seeded, *others]))
        assert got[0] == alone
    assert results(make_llm(tiny_llama).generate([PROMPTS[0]], seeded))[0] == alone


def _sequence_probabilities(llm, prompt, allowed, temperature, length):
    """Exact probability (float64) of every sequence of ``length`` tokens over ``allowed``, from
    the model's logits, in ``itertools.product`` order."""
    runner = llm.llm_engine.core.runner
    blocks = list(range(1, 1 + -(-(len(prompt) + length) // 16)))
    cache: dict[tuple, np.ndarray] = {}

    def probs(prefix: tuple) -> np.ndarray:
        if prefix not in cache:
            logits = runner.forward([prompt + list(prefix)], [blocks])[0][-1].double()[allowed]
            cache[prefix] = torch.softmax(logits / temperature, dim=0).numpy()
        return cache[prefix]

    result = []
    for sequence in itertools.product(range(len(allowed)), repeat=length):
        tokens = tuple(allowed[i] for i in sequence)
        result.append(np.prod([probs(tokens[:j])[sequence[j]] for j in range(length)]))
    return np.array(result)


def _chi_square_p_value(counts: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's test; cells expecting fewer than 5 are pooled into one."""
    small = expected < 5
    counts = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    statistic = float(((counts - expected) ** 2 / np.maximum(expected, 1e-300)).sum())
    dof = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


@pytest.mark.parametrize("drafts", ["likely", "unlikely"])
def test_joint_distribution_equals_plain_sampling(tiny_llama, drafts):
    """Unseeded requests on a 3-token vocabulary (``allowed_token_ids``), temperature 1.5, four
    tokens: the first is sampled after the prompt, then two forced drafts are verified (accepted
    or not) and the target samples the fourth. The joint distribution of the 81 sequences passes
    a chi-square test against the exact probabilities, for the speculative engine and the plain
    one alike (a check of the test itself)."""
    allowed, temperature, num_requests, length = [11, 12, 13], 1.5, 3000, 4
    prompt = PROMPTS[0]
    options = dict(num_gpu_blocks_override=1600, max_num_seqs=256, max_num_waiting=4096, seed=1234)
    llm = make_llm(tiny_llama, speculative_config={**NGRAM, "num_speculative_tokens": 3}, **options)
    expected = num_requests * _sequence_probabilities(llm, prompt, allowed, temperature, length)
    first = expected.reshape(3, -1).sum(axis=1)
    forced = [allowed[int(np.argmax(first) if drafts == "likely" else np.argmin(first))]] * length
    llm.llm_engine.core.proposer = ForcedProposer(lambda p, out: forced[len(out):])
    params = SamplingParams(temperature=temperature, max_tokens=length, ignore_eos=True, allowed_token_ids=allowed)
    index = {seq: i for i, seq in enumerate(itertools.product(allowed, repeat=length))}
    for engine, label in ((llm, "speculative"), (make_llm(tiny_llama, **options), "plain")):
        counts = np.zeros(len(index))
        for o in engine.generate([prompt] * num_requests, params):
            counts[index[tuple(o.outputs[0].token_ids)]] += 1
        p_value = _chi_square_p_value(counts, expected)
        assert p_value > 1e-3, (label, p_value)
    stats = spec_stats(llm)
    assert stats.num_drafts >= num_requests  # a rejected first draft is followed by a one-token draft
    assert stats.num_accepted_tokens_per_pos[1] > 0 and stats.num_accepted_tokens < stats.num_draft_tokens
