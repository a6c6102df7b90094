"""Server-sent events as the OpenAI API streams them, and a response that notices disconnects.

Wire format (one event per chunk, the last one literal)::

    data: {"id": "cmpl-1", "object": "text_completion", ...}\\n\\n
    data: {...}\\n\\n
    data: [DONE]\\n\\n
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_DONE = "data: [DONE]\n\n"


def format_sse(payload: BaseModel | dict[str, Any]) -> str:
    """One ``data:`` event holding ``payload`` as compact JSON (non-ASCII kept as UTF-8).

    JSON never contains a raw newline, so the event cannot be split by the client's parser.
    """
    if isinstance(payload, BaseModel):
        text = payload.model_dump_json()
    else:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n"


class SSEResponse(StreamingResponse):
    """A ``text/event-stream`` response that stops consuming its iterator when the client leaves.

    The stream and a listener for ``http.disconnect`` run side by side; whichever ends first
    cancels the other. Cancellation reaches the body iterator as ``CancelledError`` at its
    current ``await`` and the iterator is then closed (``aclose``), so its ``finally`` blocks run
    (that is where the serving code aborts the engine request).
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], headers: dict[str, str] | None = None):
        base_headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, headers={**base_headers, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as task_group:

                async def stream() -> None:
                    await self.stream_response(send)
                    task_group.cancel_scope.cancel()

                async def listen() -> None:
                    await self.listen_for_disconnect(receive)
                    task_group.cancel_scope.cancel()

                task_group.start_soon(stream)
                task_group.start_soon(listen)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
