"""The sampler's metadata for a list of scheduler ``Request``s, made as the model runner makes it
(each request takes a row of a persistent batch with the built-in logits processors), for tests
and benchmarks of the sampler alone."""

from __future__ import annotations

import numpy as np
import torch

from kvserve.model.input_batch import CachedRequestState, InputBatch
from kvserve.request import Request
from kvserve.sample.logits_processor import build_logits_processors
from kvserve.sample.metadata import SamplingMetadata


def sampling_metadata(requests: list[Request], vocab_size: int, generators: list[torch.Generator | None] | None = None,
                      device: torch.device | str = "cpu") -> SamplingMetadata:
    """Row ``i`` is ``requests[i]`` (with ``generators[i]`` for a seeded row); the sampler draws
    the uniforms itself."""
    device = torch.device(device)
    generators = generators if generators is not None else [None] * len(requests)
    batch = InputBatch(max(1, len(requests)), 64, 16, vocab_size, device,
                       build_logits_processors(vocab_size, device, max(1, len(requests))))
    for request, generator in zip(requests, generators):
        batch.add(CachedRequestState(request.spec, list(request.output_token_ids), [], 0, generator=generator))
    return batch.sampling_metadata(np.arange(len(requests)), None)
