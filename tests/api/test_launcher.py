"""``kvserve serve`` as a real process: it serves the real engine, and on SIGTERM it refuses new
requests with 503, lets the running stream finish, and exits 0."""

from __future__ import annotations

import os
import signal
import json
import subprocess
import sys
import time

import httpx
import pytest

from loopback import free_port


@pytest.mark.slow
def test_serve_process_drains_on_sigterm(tiny_llama):
    port = free_port()
    env = {**os.environ, "KVSERVE_API_KEY": "proc-key", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "kvserve.cli", "serve", str(tiny_llama), "--host", "127.0.0.1", "--port", str(port),
         "--max-model-len", "2048", "--num-gpu-blocks-override", "256", "--device", "cpu",
         "--served-model-name", "proc-model", "--shutdown-timeout", "30", "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": "Bearer proc-key"}
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                if httpx.get(base_url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.2)
        body = {"model": "proc-model", "prompt": "Once upon a time", "max_tokens": 2000,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", base_url + "/v1/completions", headers=headers, json=body,
                          timeout=60) as stream:
            lines = stream.iter_lines()
            first = next(lines)
            assert first.startswith("data: {"), first  # generating now
            process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            refused = httpx.post(base_url + "/v1/completions", headers=headers, json={"prompt": "x"})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
            events = [line[len("data: "):] for line in lines if line]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 2000
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        print(process.stdout.read().decode(errors="replace")[-5000:])
