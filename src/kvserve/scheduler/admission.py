"""Admission control: what ``Scheduler.add_requests`` refuses before anything is queued (KV fit and
queue capacity; the input processor validated everything else)."""

from __future__ import annotations

from kvserve.config import SchedulerConfig
from kvserve.errors import InvalidRequestError, RequestRejectedError
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.request import Request


def check_kv_fit(request: Request, kv_cache_manager: KVCacheManager) -> None:
    """Check that the whole KV cache could hold the request (its prompt and ``max_tokens``), so it
    can ever be scheduled. Context-length and every other per-request check belong to the input
    processor, which has run before.

    Raises:
        InvalidRequestError: it needs more KV blocks than the cache has (message with the numbers).
    """
    total = request.num_prompt_tokens + request.max_tokens
    num_blocks = kv_cache_manager.num_blocks_needed(total)
    num_usable = kv_cache_manager.block_pool.num_usable_blocks
    if num_blocks > num_usable:
        raise InvalidRequestError(
            f"prompt ({request.num_prompt_tokens} tokens) + max_tokens ({request.max_tokens}) needs "
            f"{num_blocks} KV blocks of {kv_cache_manager.block_size} tokens; the whole KV cache has "
            f"{num_usable}", param="max_tokens",
        )


def check_queue_capacity(num_waiting: int, num_running: int, config: SchedulerConfig, num_new: int = 1,
                         param: str | None = None) -> None:
    """Check that ``num_new`` more requests fit in the waiting queue. Requests that will start at
    the next step (free ``max_num_seqs`` slots) do not count as queued: the bound is
    ``max_num_waiting`` beyond those.

    Args:
        num_waiting, num_running: the scheduler's queue lengths now.
        config: the bounds.
        num_new: requests about to be added together (all choices of all prompts of one call).
        param: the request field to name when ``num_new`` can never fit (e.g. ``prompt``, ``n``).

    Raises:
        InvalidRequestError: ``num_new`` exceeds ``max_num_waiting + max_num_seqs``, so the
            requests could not be queued even into an idle engine.
        RequestRejectedError: ``reason="queue_full"`` when they do not fit now.
    """
    most = config.max_num_waiting + config.max_num_seqs
    if num_new > most:
        raise InvalidRequestError(
            f"this request needs {num_new} engine requests (prompts x n); at most {most} can be queued "
            f"at once (max_num_waiting={config.max_num_waiting} + max_num_seqs={config.max_num_seqs}); "
            "split it into smaller requests", param=param)
    free_slots = max(0, config.max_num_seqs - num_running)
    if num_waiting + num_new > config.max_num_waiting + free_slots:
        queued = max(0, num_waiting - free_slots)
        extra = f"; this request adds {num_new}" if num_new > 1 else ""
        raise RequestRejectedError(
            f"the waiting queue is full ({queued} requests queued, at most "
            f"{config.max_num_waiting} allowed{extra}); retry later",
            reason="queue_full",
        )
