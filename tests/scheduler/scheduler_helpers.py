"""Scheduler test builders (imported by tests and by conftest's fixtures)."""

from typing import NamedTuple

from kvserve.config import SchedulerConfig
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.scheduler import Scheduler


def build_scheduler(num_blocks=64, block_size=4, enable_caching=True, **config):
    config.setdefault("max_model_len", 256)
    config.setdefault("max_num_batched_tokens", 64)
    manager = KVCacheManager(num_blocks, block_size, enable_caching)
    return Scheduler(SchedulerConfig(**config), manager)


def build_request(request_id, prompt, max_tokens=8, arrival_time=0.0, **kwargs):
    params = kwargs.pop("sampling_params", None) or SamplingParams(max_tokens=max_tokens)
    return Request.of(request_id, list(prompt), params, max_tokens=max_tokens, arrival_time=arrival_time, **kwargs)


class Planned(NamedTuple):
    """One request's share of a step, as the runner sees it."""

    request_id: str
    num_computed_tokens: int
    num_new_tokens: int
    samples: bool


def planned(scheduler_output, scheduler) -> list[Planned]:
    """The step's requests in batch order: (id, computed before the step, new tokens, samples),
    read from the scheduler's messages (new requests' data and cached deltas)."""
    computed = {new.req_id: new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens))
    result = []
    for request_id, num_new in scheduler_output.num_scheduled_tokens.items():
        request = scheduler.requests[request_id]
        end = computed[request_id] + num_new
        result.append(Planned(request_id, computed[request_id], num_new,
                              end >= request.num_tokens and request.max_tokens > 0))
    return result
