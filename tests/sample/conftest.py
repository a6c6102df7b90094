"""Shared helpers for sampler tests: requests and metadata over a tiny vocabulary."""

from __future__ import annotations

import pytest
import torch

from kvserve.request import Request
from kvserve.sample.metadata import SamplingMetadata
from kvserve.sampling_params import SamplingParams


def _make_request(prompt=(1, 2, 3), output=(), eos=(), **params) -> Request:
    request = Request(
        request_id="r",
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(**params),
        eos_token_ids=frozenset(eos),
    )
    request.append_output_token_ids(list(output))
    return request


@pytest.fixture
def make_request():
    """``make_request(prompt=..., output=..., eos=..., **sampling_params)`` -> Request."""
    return _make_request


@pytest.fixture
def build():
    """``build(requests, vocab_size, generators=None)`` -> SamplingMetadata on CPU."""

    def _build(requests, vocab_size, generators=None):
        generators = generators if generators is not None else [None] * len(requests)
        return SamplingMetadata.build(requests, generators, vocab_size, torch.device("cpu"))

    return _build
