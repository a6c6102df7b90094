"""Shared helpers for sampler tests: requests and metadata over a tiny vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.model.input_batch import CachedRequestState, InputBatch
from kvserve.request import Request
from kvserve.sample.logits_processor import build_logits_processors
from kvserve.sample.metadata import SamplingMetadata
from kvserve.sampling_params import SamplingParams


def _make_request(prompt=(1, 2, 3), output=(), eos=(), **params) -> Request:
    _make_request.count += 1
    request = Request(
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


def build_metadata(requests, vocab_size, generators=None) -> SamplingMetadata:
    """The sampler's metadata for ``requests`` (row i = requests[i]), made as the model runner
    makes it: each request takes a row of a persistent batch (with the built-in logits
    processors), then the batch describes the rows."""
    device = torch.device("cpu")
    generators = generators if generators is not None else [None] * len(requests)
    batch = InputBatch(max(1, len(requests)), 64, 16, vocab_size, device, build_logits_processors(vocab_size, device))
    for request, generator in zip(requests, generators):
        batch.add(CachedRequestState(
            req_id=request.request_id, prompt_token_ids=list(request.prompt_token_ids),
            output_token_ids=list(request.output_token_ids), sampling_params=request.sampling_params,
            eos_token_ids=request.eos_token_ids, bad_words_token_ids=request.bad_words_token_ids,
            max_tokens=request.max_tokens, block_ids=[], num_computed_tokens=0, generator=generator))
    return batch.sampling_metadata(np.arange(len(requests)), None)


@pytest.fixture
def build():
    """``build(requests, vocab_size, generators=None)`` -> SamplingMetadata on CPU."""
    return build_metadata
