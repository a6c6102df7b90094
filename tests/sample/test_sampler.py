"""Greedy, logprobs, prompt logprobs and per-request seeds of the batched sampler."""

from __future__ import annotations

import math

import pytest
import torch

from kvserve.sample.logprobs import prompt_logprobs_from_logits
from kvserve.sample.sampler import NoTokenAllowedError, Sampler

V = 64


def random_logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3.0


def test_greedy_is_argmax_and_input_untouched(make_request, build):
    logits = random_logits(5, 0)
    before = logits.clone()
    metadata = build([make_request(temperature=0.0) for _ in range(5)], V)
    assert metadata.all_greedy
    output = Sampler()(logits, metadata)
    assert output.sampled_token_ids.dtype == torch.int64
    assert output.sampled_token_ids.tolist() == [max(range(V), key=lambda t: row[t]) for row in logits.tolist()]
    assert output.logprobs == [None] * 5
    assert torch.equal(logits, before)


def test_mixed_batch_greedy_rows_stay_argmax(make_request, build):
    logits = random_logits(6, 1)
    requests = [make_request(temperature=0.0 if i % 2 == 0 else 1.5, top_k=10) for i in range(6)]
    metadata = build(requests, V)
    assert not metadata.all_greedy and not metadata.all_random
    for seed in range(5):
        sampled = Sampler(torch.Generator().manual_seed(seed))(logits, metadata).sampled_token_ids
        assert sampled[0::2].tolist() == logits[0::2].argmax(dim=1).tolist()


def reference_logprobs(row: list[float]) -> list[float]:
    top = max(row)
    log_total = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - log_total for v in row]


def test_logprobs_are_raw_log_softmax_with_rank_and_top_k(make_request, build):
    logits = random_logits(4, 2)
    requests = [
        make_request(temperature=0.0, logprobs=3),
        make_request(temperature=0.7, top_k=5, logprobs=0, logit_bias={9: 50.0}),
        make_request(temperature=0.0),
        make_request(temperature=1.0, repetition_penalty=1.5, output=[4], logprobs=5),
    ]
    output = Sampler(torch.Generator().manual_seed(3))(logits, build(requests, V))
    assert output.logprobs[2] is None
    assert output.sampled_token_ids[1].item() == 9  # the +50 bias wins, logprob stays raw
    for row in (0, 1, 3):
        entry = output.logprobs[row]
        expected = reference_logprobs(logits[row].double().tolist())
        token = output.sampled_token_ids[row].item()
        assert entry.token_id == token
        assert math.isclose(entry.logprob, expected[token], abs_tol=1e-5)
        assert entry.rank == 1 + sum(value > expected[token] for value in expected)
        k = requests[row].sampling_params.logprobs
        order = sorted(range(V), key=lambda t: -expected[t])[:k]
        assert entry.top_token_ids == order
        assert all(math.isclose(a, expected[t], abs_tol=1e-5) for a, t in zip(entry.top_logprobs, order))
    assert output.logprobs[0].rank == 1


def test_prompt_logprobs_score_the_given_tokens():
    logits = random_logits(5, 4)
    tokens = [3, 17, 0, 63, 8]
    entries = prompt_logprobs_from_logits(logits, tokens, 2)
    assert [entry.token_id for entry in entries] == tokens
    for row, entry in enumerate(entries):
        expected = reference_logprobs(logits[row].double().tolist())
        assert math.isclose(entry.logprob, expected[tokens[row]], abs_tol=1e-5)
        assert entry.rank == 1 + sum(value > expected[tokens[row]] for value in expected)
        assert entry.top_token_ids == sorted(range(V), key=lambda t: -expected[t])[:2]


def run_steps(sampler, requests, generators, build, steps=12):
    """Sample ``steps`` tokens per row with fresh logits each step; returns per-row token lists."""
    tokens = [[] for _ in requests]
    for step in range(steps):
        logits = random_logits(len(requests), 100 + step)
        sampled = sampler(logits, build(requests, V, generators)).sampled_token_ids.tolist()
        for row, token in enumerate(sampled):
            tokens[row].append(token)
    return tokens


def test_seeded_row_identical_alone_and_in_any_batch(make_request, build):
    """A seeded request gets the same tokens alone and inside batches of other seeded and
    unseeded rows (its logits row is the same in every run)."""
    params = dict(temperature=1.0, top_p=0.95, seed=42)

    def seeded_row_tokens(position: int, batch_size: int, batch_seed: int) -> list[int]:
        requests, generators = [], []
        for i in range(batch_size):
            if i == position:
                requests.append(make_request(**params))
                generators.append(torch.Generator().manual_seed(42))
            else:
                seed = batch_seed + i if i % 2 else None
                requests.append(make_request(temperature=0.9, top_k=20, seed=seed))
                generators.append(None if seed is None else torch.Generator().manual_seed(seed))
        tokens = []
        for step in range(10):
            logits = random_logits(batch_size, 1000 + step + batch_seed)
            logits[position] = random_logits(1, 7 + step)[0]
            metadata = build(requests, V, generators)
            tokens.append(Sampler(torch.Generator().manual_seed(batch_seed))(logits, metadata).sampled_token_ids[position].item())
        return tokens

    alone = seeded_row_tokens(0, 1, 0)
    assert seeded_row_tokens(2, 5, 1) == alone
    assert seeded_row_tokens(0, 8, 2) == alone
    assert seeded_row_tokens(6, 7, 3) == alone
    assert len(set(alone)) > 1  # really random, not a constant


def test_unseeded_rows_follow_the_sampler_generator(make_request, build):
    requests = [make_request(temperature=1.0) for _ in range(3)]
    first = run_steps(Sampler(torch.Generator().manual_seed(5)), requests, [None] * 3, build)
    again = run_steps(Sampler(torch.Generator().manual_seed(5)), requests, [None] * 3, build)
    other = run_steps(Sampler(torch.Generator().manual_seed(6)), requests, [None] * 3, build)
    assert first == again and first != other


def test_empty_batch(make_request, build):
    output = Sampler()(torch.empty(0, V), build([], V))
    assert output.sampled_token_ids.shape == (0,) and output.logprobs == []


def test_inverse_cdf_never_picks_zero_probability_tokens():
    from kvserve.sample.sampler import _inverse_cdf_sample

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0, 0.0]] * 4 + [[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    below_one = 1.0 - 2.0**-53
    uniforms = torch.tensor([0.0, 0.4999, 0.5, below_one, below_one], dtype=torch.float64)
    assert _inverse_cdf_sample(probs, uniforms).tolist() == [1, 1, 3, 3, 2]


def test_greedy_batch_runs_only_argmax(make_request, build):
    """All-greedy without logprobs: no softmax, no copy of the logits (structure, not timing);
    bfloat16 logits are not upcast."""
    logits = random_logits(4, 11)
    metadata = build([make_request(temperature=0.0) for _ in range(4)], V)
    for dtype in (torch.float32, torch.bfloat16):
        typed = logits.to(dtype)
        with torch.profiler.profile() as profile:
            sampled = Sampler()(typed, metadata).sampled_token_ids
        assert torch.equal(sampled, typed.float().argmax(dim=1))
        ops = {event.key for event in profile.key_averages()}
        assert not ops & {"aten::_softmax", "aten::_log_softmax", "aten::copy_", "aten::clone", "aten::sort"}


def test_random_rows_without_a_distribution_stay_in_the_vocabulary(make_request, build):
    """A random row whose probabilities are undefined (a +inf or NaN logit, or every token at
    -inf, e.g. ``allowed_token_ids=[eos]`` with ``min_tokens``) has no CDF to search: it takes
    the argmax, as a greedy row would, instead of the out-of-range id ``V``; the other rows of the
    batch keep their draws."""
    for dtype in (torch.float32, torch.bfloat16):
        logits = random_logits(4, 12).to(dtype)
        logits[0, 9] = float("inf")
        logits[1, 30], logits[1, 20] = float("nan"), float("nan")
        logits[2] = float("-inf")
        requests = [make_request(temperature=t, top_k=k, top_p=p, min_p=mp, logprobs=0)
                    for t, k, p, mp in ((1.0, 5, 0.9, 0.1), (0.7, 0, 1.0, 0.0), (1.3, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0))]
        metadata = build(requests, V)
        sampled = Sampler(torch.Generator().manual_seed(0))(logits, metadata).sampled_token_ids
        assert sampled[:3].tolist() == [9, 20, 0]
        fine = Sampler(torch.Generator().manual_seed(0))(logits[3:], build(requests[3:], V)).sampled_token_ids
        assert 0 <= sampled[3].item() < V and fine.tolist() == [sampled[3].item()]


@pytest.mark.parametrize("torch_path", [False, True], ids=["cpu-kernels", "torch"])
def test_rows_their_processors_leave_empty_are_refused_and_no_others(make_request, build, torch_path):
    """A row whose logits processors mask every token (here ``allowed_token_ids=[3]`` while
    ``min_tokens`` bans EOS 3) raises ``NoTokenAllowedError`` naming exactly those batch rows,
    greedy or random. A greedy row with top-p and a tied maximum beside a random row is not
    refused: the torch path (every non-CPU device) truncates greedy rows too, and may keep the
    other tied token (a check after the draw refused it)."""

    def sampler(generator=None) -> Sampler:
        chosen = Sampler(generator)
        if torch_path:
            chosen.ops = None  # as on a device without kvserve's kernels
        return chosen

    empty = dict(allowed_token_ids=[3], min_tokens=2, eos=(3,))
    requests = [make_request(temperature=0.0, **empty), make_request(temperature=1.0, top_p=0.9),
                make_request(temperature=0.8, **empty), make_request(temperature=0.0)]
    with pytest.raises(NoTokenAllowedError) as info:
        sampler(torch.Generator().manual_seed(0))(random_logits(4, 21), build(requests, V))
    assert info.value.batch_rows == [0, 2]
    with pytest.raises(NoTokenAllowedError) as info:
        sampler()(random_logits(1, 21), build(requests[:1], V))  # all greedy
    assert info.value.batch_rows == [0]
    vocab = 4096
    for a, b in [(100, 4000), (4000, 100), (5, 9)]:
        tied = torch.randn(2, vocab, generator=torch.Generator().manual_seed(0)) - 5
        tied[0, a] = tied[0, b] = 3.0
        requests = [make_request(temperature=0.0, top_p=0.05, logit_bias={1: 0.0}),
                    make_request(temperature=0.8, top_p=0.05)]
        sampled = sampler(torch.Generator().manual_seed(0))(tied, build(requests, vocab)).sampled_token_ids
        assert sampled[0].item() == min(a, b)  # the argmax: the first of the tied maxima
