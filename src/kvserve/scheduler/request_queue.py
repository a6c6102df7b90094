"""Waiting queues of the scheduler: first come first served, or by priority.

FCFS keeps arrival order; a preempted request goes back to the HEAD, so it resumes first::

    prepend(preempted) -> [ p | r1 | r2 | r3 ] <- add(new)      peek()/pop() take from the left

The priority queue orders by ``(priority, arrival_time)``: lower ``priority`` value first (vLLM's
convention), ties by arrival; equal keys keep insertion order. A preempted request re-enters at its
own place in that order.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator

from kvserve.request import Request


class RequestQueue(ABC):
    """The waiting requests, in the order they should be scheduled."""

    @abstractmethod
    def add(self, request: Request) -> None:
        """Queue a newly arrived request."""

    @abstractmethod
    def prepend(self, request: Request) -> None:
        """Queue a preempted request so it is scheduled before newer ones."""

    @abstractmethod
    def peek(self) -> Request:
        """The next request to schedule (IndexError when empty)."""

    @abstractmethod
    def pop(self) -> Request:
        """Remove and return the next request (IndexError when empty)."""

    @abstractmethod
    def remove(self, request: Request) -> None:
        """Remove a request from anywhere in the queue (O(n); aborts only)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The requests in scheduling order."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(RequestQueue):
    """Arrival order; preempted requests at the head."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def prepend(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityRequestQueue(RequestQueue):
    """A heap keyed by ``(priority, arrival_time, insertion counter)``."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._counter), request))

    def prepend(self, request: Request) -> None:
        self.add(request)

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        kept = [entry for entry in self._heap if entry[3] is not request]
        if len(kept) == len(self._heap):
            raise ValueError(f"request {request.request_id} is not waiting")
        self._heap = kept
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap, key=lambda entry: entry[:3]))


def create_request_queue(policy: str) -> RequestQueue:
    """The queue for a ``SchedulerConfig.policy``.

    Raises:
        ValueError: an unknown policy (allowed: ``fcfs``, ``priority``).
    """
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}; allowed: 'fcfs', 'priority'")
