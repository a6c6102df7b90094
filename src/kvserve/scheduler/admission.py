"""Admission control: what ``Scheduler.add_request`` refuses before anything is queued."""

from __future__ import annotations

from kvserve.config import SchedulerConfig
from kvserve.errors import InvalidRequestError, RequestRejectedError
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.request import Request


def validate_request(request: Request, config: SchedulerConfig, kv_cache_manager: KVCacheManager) -> None:
    """Check that the request could ever run.

    Raises:
        InvalidRequestError: empty prompt; ``prompt + max_tokens > max_model_len`` (message with the
            numbers); or more KV blocks than the whole cache has (it could never be scheduled).
    """
    num_prompt = request.num_prompt_tokens
    if num_prompt == 0:
        raise InvalidRequestError("the prompt is empty; at least 1 token is required", param="prompt")
    total = num_prompt + request.max_tokens
    if total > config.max_model_len:
        raise InvalidRequestError(
            f"prompt has {num_prompt} tokens and max_tokens={request.max_tokens}; this model accepts "
            f"at most {config.max_model_len} tokens including max_tokens",
            param="max_tokens",
        )
    num_blocks = kv_cache_manager.num_blocks_needed(total)
    num_usable = kv_cache_manager.block_pool.num_usable_blocks
    if num_blocks > num_usable:
        raise InvalidRequestError(
            f"prompt ({num_prompt} tokens) + max_tokens ({request.max_tokens}) needs {num_blocks} KV "
            f"blocks of {kv_cache_manager.block_size} tokens; the whole KV cache has {num_usable}",
            param="max_tokens",
        )


def check_queue_capacity(num_waiting: int, num_running: int, config: SchedulerConfig) -> None:
    """Requests that will start at the next step (free ``max_num_seqs`` slots) do not count as
    queued: the bound is ``max_num_waiting`` beyond those.

    Raises:
        RequestRejectedError: ``reason="queue_full"`` when that many requests already wait.
    """
    free_slots = max(0, config.max_num_seqs - num_running)
    if num_waiting >= config.max_num_waiting + free_slots:
        raise RequestRejectedError(
            f"the waiting queue is full ({num_waiting - free_slots} requests queued, at most "
            f"{config.max_num_waiting} allowed); retry later",
            reason="queue_full",
        )
