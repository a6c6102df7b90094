"""Scheduler test builders (imported by tests and by conftest's fixtures)."""

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
    return Request(request_id, list(prompt), params, max_tokens=max_tokens, arrival_time=arrival_time, **kwargs)
