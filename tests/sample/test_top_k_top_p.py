"""Temperature, top-k, top-p and min-p: the processed distribution against a float64 plain-Python
reference, and the support and frequencies of many draws."""

from __future__ import annotations

import math

import pytest
import torch

from kvserve.kernels import cpu_kernels
from kvserve.sample.sampler import Sampler
from kvserve.sample.top_k_top_p import apply_top_k_top_p

V = 40
CASES = [
    dict(temperature=1.0),
    dict(temperature=0.5),
    dict(temperature=2.5),
    dict(temperature=1.0, top_k=5),
    dict(temperature=0.7, top_p=0.6),
    dict(temperature=1.3, top_k=12, top_p=0.8),
    dict(temperature=1.0, min_p=0.2),
    dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
    dict(temperature=1.0, top_k=1),
]


def reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """float64 reference; also returns the smallest |mass_before - top_p| seen (boundary margin)."""
    scaled = [value / temperature for value in logits]
    order = sorted(range(len(scaled)), key=lambda t: -scaled[t])
    keep = set(order if top_k == 0 else order[:top_k])
    margin = math.inf
    if top_p < 1.0:
        total = sum(math.exp(scaled[t]) for t in keep)
        mass_before, nucleus = 0.0, set()
        for t in order:
            if t not in keep:
                continue
            margin = min(margin, abs(mass_before - top_p))
            if mass_before >= top_p:
                break
            nucleus.add(t)
            mass_before += math.exp(scaled[t]) / total
        keep = nucleus
    total = sum(math.exp(scaled[t]) for t in keep)
    probs = [math.exp(scaled[t]) / total if t in keep else 0.0 for t in range(len(scaled))]
    if min_p > 0:
        threshold = min_p * max(probs)
        probs = [p if p >= threshold else 0.0 for p in probs]
        total = sum(probs)
        probs = [p / total for p in probs]
    return probs, margin


@pytest.fixture
def logits():
    generator = torch.Generator().manual_seed(1234)
    return torch.randn(len(CASES), V, generator=generator) * 2.0


def test_processed_distribution_matches_reference(make_request, build, logits):
    metadata = build([make_request(**case) for case in CASES], V)
    probs = Sampler().processed_probs(logits.clone(), metadata)
    for row, case in enumerate(CASES):
        expected, margin = reference_probs(logits[row].double().tolist(), **case)
        assert margin > 1e-4, "test logits too close to a top-p boundary"
        support = {t for t in range(V) if probs[row, t] > 0}
        assert support == {t for t in range(V) if expected[t] > 0}, case
        assert probs[row].double().tolist() == pytest.approx(expected, abs=2e-6), case


def test_top_k_support_size_and_top_p_is_smallest_set(make_request, build, logits):
    metadata = build([make_request(**case) for case in CASES], V)
    probs = Sampler().processed_probs(logits.clone(), metadata)
    assert int((probs[3] > 0).sum()) == 5
    assert int((probs[8] > 0).sum()) == 1 and int(probs[8].argmax()) == int(logits[8].argmax())
    # Top-p (row 4): the kept set has mass >= p and dropping its least likely token goes below p.
    plain = torch.softmax(logits[4].double() / 0.7, dim=0)
    kept = plain[probs[4] > 0]
    assert kept.sum() >= 0.6 and kept.sum() - kept.min() < 0.6


def test_draws_follow_processed_distribution(make_request, build, logits):
    """Repeat each case over many rows; every draw lies in the support and frequencies are within
    5 standard deviations of the reference probabilities."""
    repeats = 2000
    requests = [make_request(**case) for case in CASES for _ in range(repeats)]
    metadata = build(requests, V)
    sampler = Sampler(torch.Generator().manual_seed(0))
    batch_logits = logits.repeat_interleave(repeats, dim=0)
    counts = torch.zeros(len(CASES), V, dtype=torch.float64)
    for _ in range(4):
        sampled = sampler(batch_logits, metadata).sampled_token_ids.view(len(CASES), repeats)
        counts.scatter_add_(1, sampled, torch.ones_like(sampled, dtype=torch.float64))
    draws = 4 * repeats
    for row, case in enumerate(CASES):
        expected = torch.tensor(reference_probs(logits[row].double().tolist(), **case)[0], dtype=torch.float64)
        assert torch.all(counts[row][expected == 0] == 0), case
        sigma = torch.sqrt(expected * (1 - expected) / draws)
        assert torch.all((counts[row] / draws - expected).abs() <= 5 * sigma + 1e-9), case


def test_sort_free_top_p_equals_full_sort_and_falls_back_when_nucleus_is_wide():
    from kvserve.sample import top_k_top_p

    vocab_size = 5000
    generator = torch.Generator().manual_seed(9)
    peaked = torch.randn(4, vocab_size, generator=generator) * 6.0  # nucleus of a few tokens
    top_p = torch.tensor([0.5, 0.9, 0.99, 1.0])
    off = top_p >= 1.0
    fast, slow = peaked.clone(), peaked.clone()
    assert not top_k_top_p._apply_top_p_from_candidates(fast, top_p, off, 256).any()
    top_k_top_p._apply_top_p_sorted(slow, top_p, off)
    assert torch.equal(fast.isinf(), slow.isinf())
    assert not fast[3].isinf().any()  # top_p = 1 keeps everything
    for row in range(3):
        expected, _ = reference_probs(peaked[row].double().tolist(), top_p=float(top_p[row]))
        assert {t for t in range(vocab_size) if expected[t] > 0} == set((~fast[row].isinf()).nonzero().flatten().tolist())
    flat = torch.randn(2, vocab_size, generator=generator) * 0.1
    untouched = flat.clone()
    assert top_k_top_p._apply_top_p_from_candidates(flat, torch.tensor([0.9, 0.9]), torch.tensor([False, False]), 256).all()
    assert torch.equal(flat, untouched)


def test_a_wide_nucleus_beside_a_row_does_not_change_that_row():
    """A row's kept set is the same alone as beside a flat row (on CPU each row takes its own
    threshold search; the torch path sorts only the wide rows). Before, one wide row sent the
    whole batch to the full sort, whose mass (softmax of the sorted row) can differ in the last
    place from the candidate path's (softmax of the row, then a cumsum over the top tokens): with
    top_p at the candidate path's mass before the second token, the two kept one and two tokens
    here."""
    vocab_size = 5000
    row = torch.randn(1, vocab_size, generator=torch.Generator().manual_seed(0)) * 6.0
    top_probs = row.softmax(dim=1).topk(2, dim=1).values
    boundary = float((top_probs.cumsum(dim=1) - top_probs)[0, 1])
    flat = torch.randn(1, vocab_size, generator=torch.Generator().manual_seed(1)) * 0.1
    alone = row.clone()
    apply_top_k_top_p(alone, None, torch.tensor([boundary]), cpu_kernels())
    beside = torch.cat([row, flat])
    apply_top_k_top_p(beside, None, torch.tensor([boundary, 0.9]), cpu_kernels())
    assert torch.equal(beside[0].isinf(), alone[0].isinf())
    assert int((~beside[1].isinf()).sum()) > 256  # the flat row's own nucleus is wide


def _kernels_or_skip():
    from kvserve.kernels import cpu_kernels

    kernels = cpu_kernels()
    if kernels is None:
        pytest.skip("no C++ compiler for the kernels")
    return kernels


def _float64_nucleus(row: torch.Tensor, top_p: float) -> tuple[set[int], torch.Tensor, torch.Tensor]:
    """The top-p rule in float64 with ties in index order: (kept ids, ids most-likely-first, the
    mass before each of them)."""
    values = row.double()
    order = sorted(range(len(values)), key=lambda i: (-float(values[i]), i))
    ids = torch.tensor(order)
    probs = (values[ids] - values.max()).exp()
    probs /= probs.sum()
    before = probs.cumsum(0) - probs
    return set(ids[before < top_p].tolist()), ids, before


def test_top_p_kernel_keeps_the_float64_nucleus():
    """kernels/csrc/top_p.cpp on wide nuclei: the float64 rule's kept set, except a token whose
    mass-before lies within float32 summation error (1e-6) of top_p."""
    kernels = _kernels_or_skip()
    generator = torch.Generator().manual_seed(5)
    logits = torch.cat([torch.randn(2, 20000, generator=generator) * s for s in (0.1, 1.0, 2.5, 4.0)])
    top_p = torch.tensor([0.3, 0.95, 0.5, 0.9, 0.7, 0.99, 0.2, 0.6])
    out = logits.clone()
    kernels.top_p_rows(out, torch.arange(8), top_p, None)
    for row in range(8):
        expected, ids, before = _float64_nucleus(logits[row], float(top_p[row]))
        got = set((~out[row].isinf()).nonzero().flatten().tolist())
        assert len(expected) > 1
        for token in got ^ expected:
            assert abs(float(before[(ids == token).nonzero()[0, 0]]) - float(top_p[row])) < 1e-6
        assert len(got ^ expected) <= 1
        kept = ~out[row].isinf()
        assert torch.equal(out[row][kept], logits[row][kept])  # kept logits untouched


def test_top_p_kernel_breaks_ties_by_index_and_keeps_rows_alone_as_in_a_batch():
    kernels = _kernels_or_skip()
    row = torch.full((40,), -2.0)
    row[17] = 5.0
    ties = [3, 9, 25, 31]  # four tokens at 3.0: the nucleus ends inside them
    row[ties] = 3.0
    _, _, before = _float64_nucleus(row, 0.5)
    top_p = float((before[2] + before[3]) / 2)  # between the second and the third tie member
    alone = row.unsqueeze(0).clone()
    kernels.top_p_rows(alone, torch.tensor([0]), torch.tensor([top_p]), None)
    assert set((~alone[0].isinf()).nonzero().flatten().tolist()) == {17, 3, 9}
    generator = torch.Generator().manual_seed(6)
    batch = torch.cat([torch.randn(3, 40, generator=generator), row.unsqueeze(0), torch.randn(2, 40, generator=generator)])
    kernels.top_p_rows(batch, torch.tensor([5, 3, 0, 1]), torch.tensor([0.8, top_p, 0.4, 0.9]), None)
    assert torch.equal(batch[3], alone[0])
    assert not batch[2].isinf().any() and not batch[4].isinf().any()  # rows not listed are untouched


def test_top_p_kernel_leaves_rows_without_a_distribution():
    kernels = _kernels_or_skip()
    rows = torch.randn(3, 50)
    rows[0, 7] = float("nan")
    rows[1, 8] = float("inf")
    rows[2] = float("-inf")
    out = rows.clone()
    kernels.top_p_rows(out, torch.arange(3), torch.tensor([0.5, 0.5, 0.5]), None)
    assert torch.equal(out.isnan(), rows.isnan()) and torch.equal(out[~rows.isnan()], rows[~rows.isnan()])
    with pytest.raises(RuntimeError, match=r"top_p must be in \(0, 1\)"):
        kernels.top_p_rows(out, torch.tensor([0]), torch.tensor([1.0]), None)


def test_without_kernels_the_wide_rows_alone_take_the_full_sort(monkeypatch):
    from kvserve.sample import top_k_top_p

    generator = torch.Generator().manual_seed(8)
    peaked = torch.randn(1, 5000, generator=generator) * 6.0
    flat = torch.randn(1, 5000, generator=generator) * 0.1
    batch = torch.cat([peaked, flat])
    apply_top_k_top_p(batch, None, torch.tensor([0.9, 0.9]), None)
    alone = peaked.clone()
    apply_top_k_top_p(alone, None, torch.tensor([0.9]), None)
    sorted_flat = flat.clone()
    top_k_top_p._apply_top_p_sorted(sorted_flat, torch.tensor([0.9]), torch.tensor([False]))
    assert torch.equal(batch[0], alone[0]) and torch.equal(batch[1], sorted_flat[0])


def test_a_top_p_below_float32_range_keeps_the_most_likely_token():
    _kernels_or_skip()  # the kernel orders ties by index; torch's sort leaves their order open
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0]])
    apply_top_k_top_p(logits, None, torch.tensor([1e-300], dtype=torch.float64).to(torch.float32), cpu_kernels())
    assert logits[0].isinf().tolist() == [True, False, True, True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_p_kernel_on_raw_logits_with_temperature_keeps_the_scaled_rows_set(dtype):
    """The sampler's top-p-only path: ``top_p_rows`` on the raw logits with the rows'
    temperatures masks exactly the tokens it drops from ``logits.float() / T`` (torch's
    division), leaving the kept raw values as they were."""
    kernels = _kernels_or_skip()
    generator = torch.Generator().manual_seed(12)
    raw = (torch.randn(5, 3000, generator=generator) * torch.tensor([[0.3], [1.0], [3.0], [6.0], [1.5]])).to(dtype)
    rows = torch.tensor([0, 1, 2, 4])
    top_p = torch.tensor([0.5, 0.9, 0.7, 0.95])
    temperature = torch.tensor([0.7, 1.0, 1.3, 0.05])
    scaled = raw.to(torch.float32, copy=True)
    scaled[rows] = scaled[rows] / temperature.unsqueeze(1)
    kernels.top_p_rows(scaled, rows, top_p, None)
    masked = raw.clone()
    kernels.top_p_rows(masked, rows, top_p, temperature)
    assert masked.dtype == dtype
    assert torch.equal(masked.isinf(), scaled.isinf())
    assert torch.equal(masked[~masked.isinf()], raw[~masked.isinf()])
    assert torch.equal(masked[3], raw[3])  # a row not listed
