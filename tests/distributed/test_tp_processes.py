"""Tensor parallelism across process trees: ``kvserve serve -tp 2`` end to end (its answer equals
TP 1's, and a killed rank ends the server with status 1 and a line naming the rank), and two
"nodes" on loopback (node 1 a separate ``kvserve serve --node-rank 1`` process tree)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from kvserve import SamplingParams
from kvserve.engine.llm import LLM
from kvserve.testing.live_server import free_port

pytestmark = pytest.mark.slow

ENGINE_FLAGS = ["--dtype", "float32", "--max-model-len", "256", "--num-gpu-blocks-override", "64", "--seed", "0"]
PROMPT = [5, 17, 29, 41, 53, 65, 77]
CLI = "import sys; from kvserve.cli import main; sys.exit(main(sys.argv[1:]))"


def reference(model_dir, max_tokens: int):
    """TP 1's greedy continuation of PROMPT (the CompletionOutput: token ids and text)."""
    llm = LLM(str(model_dir), max_model_len=256, num_gpu_blocks_override=64, seed=0, dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate([{"prompt_token_ids": PROMPT}], params)[0].outputs[0]


def start_cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", CLI, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_healthy(base: str, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}: {process.stdout.read()}")
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("server not healthy in time")


def worker_ranks(pid: int) -> list[psutil.Process]:
    """The rank processes under ``pid``: the children of multiprocessing's fork server (not the
    server itself, not the resource tracker)."""
    servers = [p for p in psutil.Process(pid).children() if "forkserver" in " ".join(p.cmdline())]
    return [rank for server in servers for rank in server.children()]


@pytest.mark.slow
def test_serve_tp2_answers_as_tp1_and_a_killed_rank_ends_it(tiny_llama):
    want = reference(tiny_llama, 8).text
    port = free_port()
    server = start_cli("serve", str(tiny_llama), "-tp", "2", "--port", str(port), "--host", "127.0.0.1",
                       "--served-model-name", "tiny", *ENGINE_FLAGS)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, server)
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        response = httpx.post(base + "/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == want
        (rank1,) = worker_ranks(server.pid)
        rank1.kill()
        killed = time.monotonic()
        assert server.wait(timeout=30) == 1
        elapsed = time.monotonic() - killed
        output = server.stdout.read()
    finally:
        if server.poll() is None:
            server.kill()
    assert elapsed < 15, elapsed
    assert "tensor-parallel rank 1" in output and "exiting with status 1: the engine failed" in output, output


def test_two_nodes_on_loopback(tiny_llama):
    """Node 0 (this process: the driver, no local worker) and node 1 (a separate ``kvserve serve
    --node-rank 1`` process tree holding rank 1) meet at node 0's store."""
    want = reference(tiny_llama, 16).token_ids
    port = free_port()
    node1 = start_cli("serve", str(tiny_llama), "-tp", "2", "--nnodes", "2", "--node-rank", "1",
                      "--master-addr", "127.0.0.1", "--master-port", str(port), *ENGINE_FLAGS)
    try:
        llm = LLM(str(tiny_llama), max_model_len=256, num_gpu_blocks_override=64, seed=0, dtype="float32",
                  tensor_parallel_size=2, nnodes=2, node_rank=0, master_port=port)
        try:
            params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
            got = llm.generate([{"prompt_token_ids": PROMPT}], params)[0].outputs[0].token_ids
        finally:
            llm.shutdown()
        assert node1.wait(timeout=30) == 0, node1.stdout.read()
    finally:
        if node1.poll() is None:
            node1.kill()
    assert got == want
