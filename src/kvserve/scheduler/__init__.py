"""Continuous-batching scheduler (pure Python, no torch)."""

from kvserve.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput
from kvserve.scheduler.request_queue import FCFSRequestQueue, PriorityRequestQueue, RequestQueue, create_request_queue
from kvserve.scheduler.scheduler import Scheduler
from kvserve.scheduler.stats import SchedulerStats

__all__ = [
    "CachedRequestData",
    "NewRequestData",
    "FCFSRequestQueue",
    "PriorityRequestQueue",
    "RequestQueue",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerStats",
    "create_request_queue",
]
