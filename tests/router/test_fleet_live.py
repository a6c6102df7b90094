"""Real workers (built-in model) behind ``kvserve route`` on loopback: KV events from a live worker,
the shared-prefix hit rate per policy against a single worker with the same blocks, a SIGKILLed
worker mid-run, a rolling restart under load, and ``kvserve serve -dp 2``. Bounded in requests
and time; every process is stopped at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fleet_helpers import MODEL, RouterProcess, WorkerProcess, free_port, healthy, wait_for

from kvserve.api.tokenization import tokenize_prompt
from kvserve.bench.cli import main as bench_main
from kvserve.builtin import builtin_model_path
from kvserve.kv_events.subscriber import KVEventSubscriber, WorkerBlockIndex
from kvserve.router.prefix import request_block_hashes
from kvserve.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow
BLOCKS_PER_WORKER = 300
HEALTH_INTERVAL = 0.5


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fleet")
    workers = [WorkerProcess(folder, f"w{i}", BLOCKS_PER_WORKER) for i in range(2)]
    single = WorkerProcess(folder, "single", 2 * BLOCKS_PER_WORKER)
    for worker in (*workers, single):
        worker.start()
    try:
        for worker in (*workers, single):
            worker.wait_ready()
        yield folder, workers, single
    finally:
        for worker in (*workers, single):
            worker.stop()


def _complete(base: str, prompt: str, max_tokens: int = 4, stream: bool = False, timeout: float = 60) -> dict:
    """One request; returns {"status", "error" (in-band), "done", "exception"}."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
            "temperature": 0}
    outcome = {"status": None, "error": None, "done": False, "exception": None, "started": False}
    try:
        if not stream:
            response = httpx.post(base + "/v1/completions", json=body, timeout=timeout)
            outcome.update(status=response.status_code, done=response.status_code == 200)
            return outcome
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=timeout) as response:
            outcome["status"] = response.status_code
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                outcome["started"] = True
                if line == "data: [DONE]":
                    outcome["done"] = True
                elif '"error"' in line:
                    outcome["error"] = json.loads(line[6:])["error"]
    except httpx.HTTPError as exc:
        outcome["exception"] = repr(exc)
    return outcome


def test_live_worker_events_match_the_routers_hashes_and_replay(fleet):
    _, workers, _ = fleet
    worker = workers[0]
    early = KVEventSubscriber(worker.events, worker.replay, index=WorkerBlockIndex(keep_tokens=True)).start()
    tokenizer = load_tokenizer(builtin_model_path())
    prompt = "Mr. Bennet was so odd a mixture of quick parts, sarcastic humour, reserve, and caprice, " * 3
    token_ids = tokenize_prompt(tokenizer, prompt)
    expected = request_block_hashes(token_ids, 16)
    try:
        time.sleep(0.5)  # let the SUB socket join
        assert _complete(worker.url, prompt, max_tokens=1)["done"]
        wait_for(lambda: set(expected) <= early.index.hashes, 10, "the prompt's blocks announced")
        for i, block_hash in enumerate(expected):  # parent chain and tokens as the worker hashed them
            parent, tokens, _ = early.index.blocks[block_hash]
            assert tokens == tuple(token_ids[16 * i:16 * (i + 1)])
            assert parent == (expected[i - 1] if i else None)
        late = KVEventSubscriber(worker.events, worker.replay).start()  # joins now: replays from seq 0
        try:
            assert _complete(worker.url, "A fresh request makes the late subscriber see a gap", 20)["done"]
            wait_for(lambda: late.last_seq >= 0 and late.last_seq == early.last_seq, 10, "late caught up")
            assert late.num_gaps == 1 and late.index.hashes == early.index.hashes
        finally:
            late.stop()
    finally:
        early.stop()


def _bench(base: str, seed: int, folder: Path) -> dict:
    """``kvserve bench serve``'s shared-prefix run, in this process (its imports are loaded here)."""
    result = folder / f"bench-{seed}-{free_port()}.json"
    bench_main(["bench", "serve", "--base-url", base, "--model", MODEL, "--dataset-name", "shared-prefix",
                "--num-groups", "8", "--prompts-per-group", "4", "--system-prompt-len", "160", "--question-len", "32",
                "--output-len", "4", "--ignore-eos", "--max-concurrency", "8", "--seed", str(seed),
                "--result-file", str(result), "--disable-tqdm", "--no-roofline"])
    return json.loads(result.read_text())


def _hit_rate(workers, run) -> tuple[float, dict]:
    before = [w.prefix_counters() for w in workers]
    outcome = run()
    after = [w.prefix_counters() for w in workers]
    queries = sum(a[0] - b[0] for a, b in zip(after, before))
    hits = sum(a[1] - b[1] for a, b in zip(after, before))
    return hits / queries, outcome


def test_shared_prefix_hit_rate_cache_aware_vs_single_worker(fleet):
    folder, workers, single = fleet
    single_rate, result = _hit_rate([single], lambda: _bench(single.url, 101, folder))
    assert result["completed"] == 32 and result["failed"] == 0
    rates = {}
    for seed, policy in ((102, "cache_aware"), (103, "round_robin")):  # new seed = new prefixes, cold caches
        router = RouterProcess(folder, workers, policy=policy).start()
        try:
            wait_for(lambda: all(w["routable"] for w in router.workers().values()), 20, "workers routable")
            rates[policy], result = _hit_rate(workers, lambda: _bench(router.url, seed, folder))
            assert result["completed"] == 32 and result["failed"] == 0
        finally:
            router.stop()
    # 8 groups x 4 prompts, 160-token system prompts (the built-in model's context is 256): a
    # single worker misses each group's first prompt only (hit rate 3 * 160 / (4 * 192) = 0.625 at
    # most); round robin spreads a group over both workers.
    print(f"\nprefix-cache hit rate: single {single_rate:.3f}, cache_aware {rates['cache_aware']:.3f}, "
          f"round_robin {rates['round_robin']:.3f}")
    assert single_rate <= 3 * 160 / (4 * 192) + 1e-9
    assert rates["cache_aware"] >= 0.9 * single_rate
    assert rates["round_robin"] < rates["cache_aware"]


def test_sigkill_mid_run_retries_the_unstarted_and_ends_streams_in_band(fleet):
    folder, workers, _ = fleet
    router = RouterProcess(folder, workers, policy="least_load").start()
    victim = workers[1]
    try:
        wait_for(lambda: all(w["routable"] for w in router.workers().values()), 20, "workers routable")
        prompts = [(f"Request {i} about Netherfield Park and its new tenant. " * 4, i % 2 == 0) for i in range(36)]
        with ThreadPoolExecutor(9) as pool:
            futures = [pool.submit(_complete, router.url, p, 48, s) for p, s in prompts]
            time.sleep(1.5)
            victim.kill()
            killed_at = time.monotonic()
            wait_for(lambda: not router.workers()[victim.url]["healthy"], 5, "ejection", interval=0.02)
            ejected_after = time.monotonic() - killed_at
            outcomes = [f.result() for f in futures]
        streamed = [o for (_, s), o in zip(prompts, outcomes) if s]
        plain = [o for (_, s), o in zip(prompts, outcomes) if not s]
        assert all(o["status"] == 200 and o["done"] for o in plain), plain
        assert all(o["exception"] is None and o["status"] == 200 and o["done"] for o in streamed), streamed
        broken = [o for o in streamed if o["error"] is not None]
        assert all(o["started"] and o["error"]["code"] == "worker_failed" for o in broken)
        print(f"\nSIGKILL: {len(broken)} streams ended in-band, ejected after {ejected_after * 1000:.0f} ms")
        assert ejected_after <= HEALTH_INTERVAL + 0.5
        victim.start().wait_ready()
        wait_for(lambda: router.workers()[victim.url]["routable"], 15, "re-admission")
        served = [_complete(router.url, f"After the return {i}", 2) for i in range(6)]
        assert all(o["done"] for o in served)
    finally:
        router.stop()
        if victim.process.poll() is not None:
            victim.start().wait_ready()


def test_rolling_restart_under_load_fails_no_request(fleet):
    """The fleet's last test: the workers it leaves running are the script's, stopped at its end."""
    folder, workers, _ = fleet
    router = RouterProcess(folder, workers).start()
    for worker in workers:
        (folder / f"{worker.port}.pid").write_text(str(worker.process.pid))
    template = " ".join(f"'{part}'" if " " in part or "{" in part else part for part in workers[0].command())
    template = template.replace(str(workers[0].port), "{port}")  # the port and the KV-event paths
    start_cmd = f"OMP_NUM_THREADS=1 nohup {template} > {folder}/restart-{{port}}.log 2>&1 & echo $! > {folder}/{{port}}.pid"
    stop_cmd = f"kill -TERM $(cat {folder}/{{port}}.pid)"
    outcomes, stop = [], threading.Event()

    def load(k: int) -> None:
        i = 0
        while not stop.is_set() and i < 200:
            outcomes.append(_complete(router.url, f"Load {k}-{i}: Elizabeth walked to Netherfield. " * 3, 16,
                                      stream=i % 2 == 0))
            i += 1

    try:
        wait_for(lambda: all(w["routable"] for w in router.workers().values()), 20, "workers routable")
        threads = [threading.Thread(target=load, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        script = Path(__file__).parents[2] / "scripts" / "rolling_restart.py"
        run = subprocess.run([sys.executable, str(script), "--router", router.url, "--stop-cmd", stop_cmd,
                              "--start-cmd", start_cmd, "--timeout", "600"], capture_output=True, text=True,
                             timeout=2000)
        stop.set()
        for thread in threads:
            thread.join(120)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"restarted {len(workers)} workers" in run.stdout
        failed = [o for o in outcomes if not (o["status"] == 200 and o["done"] and o["error"] is None
                                              and o["exception"] is None)]
        print(f"\nrolling restart: {len(outcomes)} requests, {len(failed)} failed")
        assert len(outcomes) >= 12 and failed == []
        assert all(w["routable"] for w in router.workers().values())
    finally:
        stop.set()
        router.stop()
        for worker in workers:  # the script's processes replaced the fixture's: stop them
            pid_file = folder / f"{worker.port}.pid"
            pid = int(pid_file.read_text()) if pid_file.exists() else None
            if pid and pid != worker.process.pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                wait_for(lambda: not healthy(worker.url), 60, "restarted worker stopped")


def test_serve_data_parallel_two_engines_one_port(tmp_path):
    port = free_port()
    log = open(tmp_path / "dp.log", "wb")
    command = [sys.executable, "-m", "kvserve.cli", "serve", "-dp", "2", "--host", "127.0.0.1", "--port", str(port),
               "--num-gpu-blocks-override", "100", "--cpu-threads", "2", "--log-level", "warning",
               "--disable-log-stats"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: process.poll() is not None or healthy(base), 180, "dp server ready")
        assert process.poll() is None, (tmp_path / "dp.log").read_text()[-3000:]
        workers = httpx.get(base + "/workers").json()["workers"]
        assert len(workers) == 2 and all(w["kv_events"].startswith("ipc://") for w in workers)
        assert workers[0]["kv_events"].split(",")[0] + "_dp1" == workers[1]["kv_events"].split(",")[0]
        prompt = "It is a truth universally acknowledged, that a single man in possession of a good fortune " * 2
        answers = [_complete(base, prompt, 3) for _ in range(4)]
        assert all(o["done"] for o in answers)
        wait_for(lambda: sum((w["cached_blocks"] or 0) for w in httpx.get(base + "/workers").json()["workers"]) > 0,
                 10, "KV events from the engines")
        assert httpx.get(base + "/v1/models").json()["data"][0]["id"] == MODEL
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
    assert process.returncode == 0
