"""SIGTERM with requests still running past ``--shutdown-timeout``: their streams end with an
OpenAI error event and ``data: [DONE]`` (not a cut connection), and the server stops."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx

from kvserve.testing.live_server import start_live_server


def test_streams_past_the_deadline_end_with_error_and_done(tiny_llama):
    server = start_live_server(str(tiny_llama), api_key="", settings={"shutdown_timeout": 0.5},
                               max_model_len=4096, num_gpu_blocks_override=300)
    events: list[str] = []

    def stream() -> None:
        body = {"model": server.model, "prompt": "Hello", "max_tokens": 4000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as response:
            events.extend(line for line in response.iter_lines() if line.startswith("data: "))

    client = threading.Thread(target=stream)
    client.start()
    deadline = time.monotonic() + 30
    while server.serving_state.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.server.handle_exit(signal.SIGTERM, None)
    client.join(30)
    server.thread.join(30)
    server.engine.shutdown()
    assert not client.is_alive() and not server.thread.is_alive()
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "shutting_down" and "shut down" in error["message"]
    assert len(events) > 3  # some tokens were streamed before the deadline
