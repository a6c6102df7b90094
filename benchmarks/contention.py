"""Decode speed on an idle CPU and with one core taken by another busy process, in one run.

    python benchmarks/contention.py                          # built-in model, every config below
    python benchmarks/contention.py --model /tmp/qwen-shaped --tokens 32 --config default \
        --config "spin10k=GOMP_SPINCOUNT=10000"

For each configuration (environment variables set before torch loads, so libgomp reads them), a
child process loads the model once with the offline ``LLM`` and times greedy decoding at batch 1
(ms per token) and with 8 prompts at once (tokens per second, "c8"): first on the idle machine,
then while a busy-loop process pinned to one core (``--busy-core``) runs, then idle again. The
table gives the busy/idle ratio of each; a ratio near 1 is what graceful degradation means.

Configurations (``--config NAME=VAR=VALUE;VAR=VALUE``; default: all of these). ``SPIN_US=N`` is
not an environment variable: it sets the kernel worker pool's spin window (``thread_pool.h``) in
the child; ``PYTHONPATH=<checkout>/src`` measures another checkout of kvserve.

    libgomp        nothing set: libgomp's default spin (GOMP_SPINCOUNT 300,000 before sleeping)
    kvserve        what `kvserve serve` sets by default (kvserve.cpu_threads.process_environment)
    spin10k        GOMP_SPINCOUNT=10000
    spin1k         GOMP_SPINCOUNT=1000
    passive        OMP_WAIT_POLICY=PASSIVE (sleep at once)
    threads1       OMP_NUM_THREADS=1

Other processes on the machine disturb every figure; only ratios within one run compare, and the
run is meaningful only on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CONFIGS = {
    "libgomp": {},
    "kvserve": None,  # filled from kvserve.cpu_threads.process_environment()
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "threads1": {"OMP_NUM_THREADS": "1"},
}
_OMP_VARS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def busy_loop(core: int) -> subprocess.Popen:
    """A Python process spinning on ``core`` until killed."""
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def measure(llm, tokens: int, batch: int, repeats: int) -> float:
    """Fastest of ``repeats`` runs, in seconds per decode step of ``batch`` greedy requests
    generating ``tokens`` each (the fastest is the least disturbed by other processes)."""
    from kvserve.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompts = [f"Prompt number {i} for the contention benchmark." for i in range(batch)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(prompts, params)
        times.append((time.perf_counter() - start) / tokens)
    return min(times)


def child(args: argparse.Namespace) -> None:
    from kvserve.engine.llm import LLM
    import torch

    llm = LLM(args.model, max_model_len=256, num_gpu_blocks_override=256, enable_prefix_caching=False,
              dtype=args.dtype)
    if args.spin_us is not None:
        from kvserve.kernels import cpu_kernels

        cpu_kernels().set_pool_spin_us(args.spin_us)
    measure(llm, 4, 1, 1)  # warm-up: kernels, allocator
    result: dict = {"threads": torch.get_num_threads()}
    for phase in ("idle", "busy", "idle_again"):
        spinner = busy_loop(args.busy_core) if phase == "busy" else None
        try:
            time.sleep(0.5 if spinner else 0)
            result[phase] = {"b1": measure(llm, args.tokens, 1, args.repeats),
                             "c8": measure(llm, args.tokens, 8, args.repeats)}
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    print("RESULT " + json.dumps(result), flush=True)


def run_config(name: str, env: dict[str, str], args: argparse.Namespace) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in _OMP_VARS}
    command = [sys.executable, __file__, "--child", "--model", args.model, "--tokens", str(args.tokens),
               "--repeats", str(args.repeats), "--busy-core", str(args.busy_core), "--dtype", args.dtype]
    if "SPIN_US" in env:
        command += ["--spin-us", env["SPIN_US"]]
    done = subprocess.run(command, env={**clean, **env}, capture_output=True, text=True, check=False)
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"config {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def parse_config(text: str) -> tuple[str, dict[str, str] | None]:
    name, _, spec = text.partition("=")
    if not spec:
        if name not in CONFIGS:
            raise SystemExit(f"unknown config {name!r}; give NAME=VAR=VALUE;... or one of {', '.join(CONFIGS)}")
        return name, CONFIGS[name]
    return name, dict(item.split("=", 1) for item in spec.split(";") if item)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the built-in model)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens generated per measurement (default 24)")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per cell, the fastest kept (default 5)")
    parser.add_argument("--busy-core", type=int, default=1, help="core the busy loop is pinned to (default 1)")
    parser.add_argument("--dtype", default="auto", help="model dtype (default auto)")
    parser.add_argument("--config", action="append", default=None, help="NAME or NAME=VAR=VALUE;... (repeat)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spin-us", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model is None:
        from kvserve.builtin import builtin_model_path

        args.model = str(builtin_model_path())
    if args.child:
        child(args)
        return
    configs = [parse_config(text) for text in (args.config or list(CONFIGS))]
    results = {}
    print(f"model {args.model}, {args.tokens} tokens x {args.repeats}, busy loop on core {args.busy_core}, "
          f"CPUs {sorted(os.sched_getaffinity(0))}")
    print(f"{'config':<10} {'thr':>3} {'b1 idle ms':>10} {'b1 busy ms':>10} {'ratio':>6} "
          f"{'c8 idle tok/s':>13} {'c8 busy tok/s':>13} {'ratio':>6} {'b1 idle again':>13}")
    for name, env in configs:
        if env is None:
            from kvserve.cpu_threads import process_environment

            env = process_environment()
        r = run_config(name, env, args)
        results[name] = {"env": env, **r}
        b1i, b1b, b1a = r["idle"]["b1"] * 1e3, r["busy"]["b1"] * 1e3, r["idle_again"]["b1"] * 1e3
        c8i, c8b = 8 / r["idle"]["c8"], 8 / r["busy"]["c8"]
        print(f"{name:<10} {r['threads']:>3} {b1i:>10.2f} {b1b:>10.2f} {b1b / b1i:>6.2f} "
              f"{c8i:>13.1f} {c8b:>13.1f} {c8i / c8b:>6.2f} {b1a:>13.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
