"""Shared helpers for sampler tests: requests and metadata over a tiny vocabulary."""

from __future__ import annotations

import pytest

from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.testing.sampling import sampling_metadata


def _make_request(prompt=(1, 2, 3), output=(), eos=(), **params) -> Request:
    _make_request.count += 1
    request = Request.of(
        request_id=f"r{_make_request.count}",
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(**params),
        eos_token_ids=frozenset(eos),
    )
    request.append_output_token_ids(list(output))
    return request


_make_request.count = 0


@pytest.fixture
def make_request():
    """``make_request(prompt=..., output=..., eos=..., **sampling_params)`` -> Request."""
    return _make_request


@pytest.fixture
def build():
    """``build(requests, vocab_size, generators=None)`` -> SamplingMetadata on CPU."""
    return sampling_metadata
