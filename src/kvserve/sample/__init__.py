"""Batched token sampling: the model runner's persistent batch makes a ``SamplingMetadata`` per
step (logits processors included), then ``Sampler()(logits, metadata)``;
``prompt_logprobs_from_logits`` for prompt logprobs."""

from kvserve.sample.logprobs import prompt_logprobs_from_logits
from kvserve.sample.metadata import SamplingMetadata
from kvserve.sample.sampler import Sampler, SamplerOutput

__all__ = ["Sampler", "SamplerOutput", "SamplingMetadata", "prompt_logprobs_from_logits"]
