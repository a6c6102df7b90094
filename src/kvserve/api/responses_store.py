"""Stored responses (``store: true``): what ``GET``/``DELETE /v1/responses/{id}``, ``/cancel`` and
a follow-up's ``previous_response_id`` read. In memory, at most ``--responses-store-max``
entries; the least recently used one (created, read or continued) is dropped first.

    StoredResponse: response (as it stands; a background one is updated as it runs)
                    messages (the chat conversation it answered, without its instructions)
                    owner (the API key that created it: another key's id reads as unknown)
                    task (a background response's generation), events (a streamed background
                    response's event log)

vLLM 0.32 keeps responses only with ``VLLM_ENABLE_RESPONSES_API_STORE=1``, unbounded; with
``--responses-store-max 0`` kvserve stores nothing, as vLLM by default (``store: true`` is then
answered as ``store: false``, and ``background`` is refused).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

from kvserve.api.responses_objects import ResponseEvent, ResponsesResponse


class EventLog:
    """The events of a streamed background response, for its first stream and for ``GET
    ?stream=true&starting_after=N`` replays (vLLM's ``event_store``)."""

    def __init__(self) -> None:
        self.events: list[ResponseEvent] = []
        self.closed = False
        self._changed = asyncio.Event()

    def append(self, event: ResponseEvent) -> None:
        self.events.append(event)
        self._changed.set()

    def close(self) -> None:
        """No more events (the response ended, failed or was cancelled)."""
        self.closed = True
        self._changed.set()

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[ResponseEvent]:
        """The events after sequence number ``starting_after`` (all when None), then each new
        one as it comes, until the log is closed."""
        at = 0 if starting_after is None else starting_after + 1
        while True:
            self._changed.clear()
            while at < len(self.events):
                yield self.events[at]
                at += 1
            if self.closed:
                return
            await self._changed.wait()


@dataclass
class StoredResponse:
    response: ResponsesResponse
    messages: list[dict]
    owner: str
    task: asyncio.Task | None = None
    events: EventLog | None = None

    def end_task(self) -> None:
        """Cancel the background generation if it runs (its call is then aborted)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()


class ResponsesStore:
    """At most ``max_entries`` responses, least recently used dropped first (0: none kept).
    Used from the event loop only."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        """Keep ``entry`` under its response's id; a dropped entry's background generation is
        cancelled (no one could read its result)."""
        if not self.enabled:
            return
        self._entries[entry.response.id] = entry
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.max_entries:
            _, dropped = self._entries.popitem(last=False)
            dropped.end_task()

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The entry (now the most recently used), or None: unknown, dropped, or another key's."""
        entry = self._entries.get(response_id)
        if entry is None or entry.owner != owner:
            return None
        self._entries.move_to_end(response_id)
        return entry

    def pop(self, response_id: str, owner: str) -> StoredResponse | None:
        entry = self.get(response_id, owner)
        if entry is not None:
            del self._entries[response_id]
        return entry
