"""Turning one streamed OpenAI response into per-request timings.

An OpenAI-compatible server streams Server-Sent Events (WHATWG HTML spec, "Server-sent events"):
``data: {json}`` lines, events separated by a blank line, ``data: [DONE]`` at the end. With
``stream_options.include_usage`` the last JSON chunk has ``"choices": []`` and a ``usage`` object.

Timeline of one request as measured here (all times from ``time.perf_counter``, seconds)::

    send ──────── c0 ──── c1 ── c2 ──────── c3 ── usage ── [DONE]/EOF
    |<── TTFT ───>|<ITL0>|<ITL1>|<─ ITL2 ──>|                   |
    |<────────────────────────── E2E latency ──────────────────>|

Only *content chunks* (a choice with non-empty ``text`` for completions, or non-empty
``delta.content`` / ``delta.reasoning_content`` / a tool call's ``function.name`` or
``function.arguments`` for chat) are timed: the role-only first chunk a
chat server sends carries no token and would make TTFT look better than it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_SSE_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass
class RequestFuncOutput:
    """What one benchmark request measured (names as in vLLM's ``benchmark_serving``).

    Attributes:
        success: the server answered 200 and the stream ended without an error event.
        error: why it failed ('' on success).
        prompt_len: prompt tokens: the server's ``usage.prompt_tokens`` when reported, else the
            length counted by the benchmark's tokenizer.
        output_tokens: generated tokens, ``None`` until known.
        output_tokens_source: ``"usage"`` (server's ``completion_tokens``) or ``"tokenizer"``
            (the generated text re-tokenized by the benchmark).
        generated_text: the concatenated content of all chunks.
        ttft: seconds from send to the first content chunk (0.0 when there was none).
        itl: seconds between consecutive content chunks (len = content chunks - 1).
        latency: end-to-end seconds from send to the end of the stream.
        start_time, end_time: absolute ``perf_counter`` seconds of send and stream end.
        client_queue_time: seconds from the request's arrival time to its send (waiting for a
            ``max_concurrency`` slot), vLLM's ``client_queue_time``.
    """

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int | None = None
    output_tokens_source: str = ""
    generated_text: str = ""
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    end_time: float = 0.0
    client_queue_time: float = 0.0


class SSELineSplitter:
    """Bytes to SSE lines, ending lines only at CR, LF or CRLF as the SSE spec says.

    Generic text line splitting (``str.splitlines``, which ``httpx``'s ``aiter_lines`` follows)
    also breaks at U+2028, U+2029 and U+0085, which a server may legally leave unescaped inside a
    JSON string, cutting one event in two. Lines are decoded as UTF-8 once complete, so a
    character split across network chunks is rejoined first.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._after_cr = False

    def feed(self, data: bytes) -> list[str]:
        """The lines completed by ``data`` (without terminators)."""
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]  # the LF of a CRLF split across chunks
        self._after_cr = data.endswith(b"\r")
        *lines, self._buf = _SSE_LINE_END.split(self._buf + data)
        return [line.decode("utf-8", "replace") for line in lines]

    def flush(self) -> list[str]:
        """The unterminated last line, if any."""
        rest, self._buf = self._buf, b""
        return [rest.decode("utf-8", "replace")] if rest else []


class SSEParser:
    """Incremental SSE decoder: feed lines (without line terminators), get ``data`` payloads.

    Multi-line ``data:`` fields of one event are joined with ``\\n`` as the spec says; comment
    lines (``:...``) and other fields (``event:``, ``id:``, ``retry:``) are ignored.
    """

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed_line(self, line: str) -> str | None:
        """Consume one line; return the event's data when this line completes an event."""
        if line == "":
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return data
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """At end of stream: the pending event's data, if the server omitted the final blank line."""
        return self.feed_line("")


def chunk_content(chunk: dict) -> str:
    """The generated text in one parsed completions or chat chunk ('' if none)."""
    parts = []
    for choice in chunk.get("choices") or []:
        if "text" in choice:
            parts.append(choice.get("text") or "")
        delta = choice.get("delta") or {}
        parts.append(delta.get("content") or "")
        parts.append(delta.get("reasoning_content") or "")
        for call in delta.get("tool_calls") or []:  # a tool call's tokens stream as its name and arguments
            function = (call or {}).get("function") or {}
            parts.append(function.get("name") or "")
            parts.append(function.get("arguments") or "")
    return "".join(parts)


class StreamAccumulator:
    """Builds a :class:`RequestFuncOutput` from timestamped SSE data payloads.

    Separate from the HTTP code so that timings can be checked against a scripted clock.

    Args:
        start_time: ``perf_counter`` seconds when the request was sent.
        prompt_len: the prompt's token count by the benchmark's tokenizer (replaced by the
            server's ``usage.prompt_tokens`` when that arrives).
    """

    def __init__(self, start_time: float, prompt_len: int):
        self.out = RequestFuncOutput(start_time=start_time, prompt_len=prompt_len)
        self._last_content_time: float | None = None
        self._done = False
        self._texts: list[str] = []

    def on_data(self, data: str, now: float) -> None:
        """Handle one event's data received at ``now`` (perf_counter seconds)."""
        if self._done or self.out.error:
            return
        if data.strip() == "[DONE]":
            self._done = True
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            self.out.error = f"malformed SSE data (not JSON): {data[:200]!r}"
            return
        if "error" in chunk:
            self.out.error = f"error event in stream: {json.dumps(chunk['error'])[:500]}"
            return
        usage = chunk.get("usage")
        if usage:
            if usage.get("completion_tokens") is not None:
                self.out.output_tokens = int(usage["completion_tokens"])
                self.out.output_tokens_source = "usage"
            if usage.get("prompt_tokens") is not None:
                self.out.prompt_len = int(usage["prompt_tokens"])
        text = chunk_content(chunk)
        if not text:
            return
        if self._last_content_time is None:
            self.out.ttft = now - self.out.start_time
        else:
            self.out.itl.append(now - self._last_content_time)
        self._last_content_time = now
        self._texts.append(text)

    def finish(self, now: float, error: str = "") -> RequestFuncOutput:
        """Close the request at ``now``; ``error`` (e.g. an HTTP failure) marks it failed."""
        out = self.out
        out.end_time = now
        out.latency = now - out.start_time
        out.generated_text = "".join(self._texts)
        out.error = out.error or error
        if not out.error and self._last_content_time is None:
            out.error = "stream ended without any generated text"
        out.success = not out.error
        return out
