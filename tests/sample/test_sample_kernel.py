"""The C++ sampling kernel (``sample_rows``, ``kernels/csrc/sample.cpp``): draws follow
softmax(logits / T) by inverse transform (checked against a float64 reference), never pick a
-inf token, report rows without a distribution, and give a row the same token alone, beside
truncating or penalized rows, from bfloat16 or float32 logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.sample.sampler import Sampler

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")


def draw(logits: torch.Tensor, temperature: float, uniforms: list[float]) -> list[int]:
    """Each uniform drawn against the same row."""
    rows = torch.zeros(len(uniforms), dtype=torch.int64)
    temps = torch.full((len(uniforms),), temperature, dtype=torch.float32)
    return cpu_kernels().sample_rows(logits.reshape(1, -1).contiguous(), rows, temps,
                                     torch.tensor(uniforms, dtype=torch.float64)).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab, temperature", [(1000, 1.0), (1000, 0.7), (151_936, 1.3)])
def test_draws_follow_the_float64_inverse_cdf(dtype, vocab, temperature):
    logits = (torch.randn(vocab, generator=torch.Generator().manual_seed(vocab)) * 4).to(dtype)
    y = logits.double().numpy() / temperature  # the reference in float64
    p = np.exp(y - y.max())
    cdf = np.cumsum(p / p.sum())
    uniforms = (np.arange(4000) + 0.5) / 4000
    expected = np.searchsorted(cdf, uniforms, side="right")
    got = np.array(draw(logits, temperature, uniforms.tolist()))
    # a draw may differ only where u lies within float rounding of a CDF step
    near_step = np.abs(cdf[np.minimum(expected, vocab - 1)] - uniforms) < 1e-5
    near_step |= np.abs(cdf[np.maximum(expected - 1, 0)] - uniforms) < 1e-5
    assert np.all((got == expected) | near_step)
    assert (got == expected).mean() > 0.99


def test_minus_inf_tokens_are_never_drawn_and_edges_pick_the_first_and_last_kept():
    logits = torch.full((600,), -torch.inf)
    kept = [3, 255, 256, 599]
    logits[kept] = torch.tensor([0.5, -1.0, 2.0, 0.0])
    below_one = 1.0 - 2.0**-53
    uniforms = [0.0, below_one] + np.linspace(0, 1, 500, endpoint=False).tolist()
    got = draw(logits, 1.0, uniforms)
    assert got[0] == 3 and got[1] == 599
    assert set(got) == set(kept)


def test_rows_without_a_distribution_return_the_vocabulary_size():
    vocab = 40
    logits = torch.randn(4, vocab)
    logits[0, 7] = torch.nan
    logits[1, 9] = torch.inf
    logits[2] = -torch.inf
    rows = torch.arange(4)
    got = cpu_kernels().sample_rows(logits, rows, torch.ones(4), torch.full((4,), 0.5, dtype=torch.float64))
    assert got[:3].tolist() == [vocab] * 3 and 0 <= got[3] < vocab


def test_a_row_draws_the_same_token_alone_and_beside_truncating_or_penalized_rows(make_request, build):
    """Plain temperature sampling of one row reads the raw logits alone, a float32 copy beside a
    penalized row and a masked copy beside a top-k/top-p row: the same token every time, from
    bfloat16 and float32 logits."""
    vocab = 3000
    row = torch.randn(vocab, generator=torch.Generator().manual_seed(3)) * 3

    def token(neighbours: list[dict], dtype, u: float) -> int:
        requests = [make_request(temperature=0.8)] + [make_request(**n) for n in neighbours]
        logits = torch.randn(len(requests), vocab, generator=torch.Generator().manual_seed(9)) * 3
        logits[0] = row
        metadata = build(requests, vocab)
        metadata = type(metadata)(**{**metadata.__dict__, "uniforms": torch.full((len(requests),), u, dtype=torch.float64)})
        return Sampler()(logits.to(dtype), metadata).sampled_token_ids[0].item()

    for dtype in (torch.float32, torch.bfloat16):
        # u just below and just above the point where the row's token changes (found by
        # bisection alone): any other rounding of the row's sums would move that point.
        lo, hi = 0.4, 0.6
        first = token([], dtype, lo)
        assert token([], dtype, hi) != first
        while np.nextafter(lo, 1.0) < hi:
            mid = (lo + hi) / 2 if (lo + hi) / 2 not in (lo, hi) else np.nextafter(lo, 1.0)
            lo, hi = (mid, hi) if token([], dtype, mid) == first else (lo, mid)
        for u in (lo, hi):
            alone = token([], dtype, u)
            assert token([dict(temperature=1.0, top_p=0.9), dict(temperature=0.5, top_k=5)], dtype, u) == alone
            assert token([dict(temperature=1.2, presence_penalty=1.5, min_p=0.1)], dtype, u) == alone
            assert token([dict(temperature=0.0)], dtype, u) == alone


def test_top_p_alone_masks_the_raw_logits_and_draws_what_the_scaled_copy_path_draws(make_request, build):
    """A batch whose only truncation is top-p takes the one-pass path (top_p.cpp on the raw logits
    with each row's temperature); beside a min-p row the batch takes the scaled-copy path. Every
    top-p row draws the same token both ways, for many uniforms, from bfloat16 and float32 logits."""
    vocab = 3000
    params = [dict(temperature=0.8, top_p=0.9), dict(temperature=1.3, top_p=0.5), dict(temperature=1.0, top_p=0.99),
              dict(temperature=0.3, top_p=0.7), dict(temperature=1.0)]
    scales = torch.tensor([[1.0], [3.0], [0.3], [6.0], [2.0]])
    base = torch.randn(len(params), vocab, generator=torch.Generator().manual_seed(21)) * scales

    def tokens(extra: list[dict], dtype, u: float) -> list[int]:
        requests = [make_request(**p) for p in params + extra]
        logits = torch.cat([base, torch.randn(len(extra), vocab, generator=torch.Generator().manual_seed(22))])
        metadata = build(requests, vocab)
        metadata = type(metadata)(**{**metadata.__dict__, "uniforms": torch.full((len(requests),), u, dtype=torch.float64)})
        assert (metadata.min_p is None) == (not extra) and metadata.top_k is None
        return Sampler()(logits.to(dtype), metadata).sampled_token_ids[: len(params)].tolist()

    for dtype in (torch.float32, torch.bfloat16):
        for u in np.linspace(0.0, 1.0, 41, endpoint=False):
            assert tokens([], dtype, u) == tokens([dict(temperature=1.0, min_p=1e-30)], dtype, u)
