"""Waiting queues of the scheduler: first come first served, or by priority.

FCFS orders by ``Request.queue_key``: the arrival time plus a constant slack for a request without
latency targets (so arrival order), the time its prompt must start by for one with a TTFT target
(``kvserve.slo.scheduling``); equal keys keep insertion order. A preempted (or deferred) request
goes back to the HEAD, so it resumes first::

    prepend(preempted) -> [ p | r1 | r2 | r3 ] <- add(new), placed by its key
                                                   peek()/pop() take from the left

The priority queue orders by ``(priority, queue_key)``: lower ``priority`` value first (vLLM's
convention), ties by arrival (or start-by time); equal keys keep insertion order. A preempted
request re-enters at its own place in that order.
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
    def split(self, request: Request) -> tuple[list[Request], list[Request]]:
        """The waiting requests that would be scheduled before ``request`` (not queued) if it
        were added now, and those after it, each in scheduling order."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]:
        """The requests in scheduling order."""

    def __bool__(self) -> bool:
        return len(self) > 0


class FCFSRequestQueue(RequestQueue):
    """By ``queue_key`` (arrival order without targets); preempted requests at the head."""

    def __init__(self) -> None:
        self._head: deque[Request] = deque()
        self._heap: list[tuple[float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.queue_key, next(self._counter), request))

    def prepend(self, request: Request) -> None:
        self._head.appendleft(request)

    def peek(self) -> Request:
        return self._head[0] if self._head else self._heap[0][2]

    def pop(self) -> Request:
        return self._head.popleft() if self._head else heapq.heappop(self._heap)[2]

    def remove(self, request: Request) -> None:
        if request in self._head:
            self._head.remove(request)
            return
        self._heap = _without(self._heap, request)

    def split(self, request: Request) -> tuple[list[Request], list[Request]]:
        before, after = _split(self._heap, (request.queue_key,))
        return list(self._head) + before, after

    def __len__(self) -> int:
        return len(self._head) + len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return itertools.chain(self._head, _ordered(self._heap))


class PriorityRequestQueue(RequestQueue):
    """A heap keyed by ``(priority, queue_key, insertion counter)``."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.queue_key, next(self._counter), request))

    def prepend(self, request: Request) -> None:
        self.add(request)

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        self._heap = _without(self._heap, request)

    def split(self, request: Request) -> tuple[list[Request], list[Request]]:
        return _split(self._heap, (request.priority, request.queue_key))

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return iter(_ordered(self._heap))


def _ordered(heap: list[tuple]) -> list[Request]:
    """The requests of ``heap`` (each entry ``(*key, insertion counter, request)``) in key order."""
    return [entry[-1] for entry in sorted(heap, key=lambda entry: entry[:-1])]


def _split(heap: list[tuple], key: tuple) -> tuple[list[Request], list[Request]]:
    """``heap``'s requests whose entries' leading ``key`` fields are at most ``key`` (a new request
    with that key goes after them: it has the largest counter), and the rest, each in order."""
    ordered = sorted(heap, key=lambda entry: entry[:-1])
    cut = next((i for i, entry in enumerate(ordered) if entry[:len(key)] > key), len(ordered))
    return [e[-1] for e in ordered[:cut]], [e[-1] for e in ordered[cut:]]


def _without(heap: list[tuple], request: Request) -> list[tuple]:
    """``heap`` less ``request``'s entry (the last element of each), a heap again.

    Raises:
        ValueError: ``request`` is not in it.
    """
    kept = [entry for entry in heap if entry[-1] is not request]
    if len(kept) == len(heap):
        raise ValueError(f"request {request.request_id} is not waiting")
    heapq.heapify(kept)
    return kept


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
