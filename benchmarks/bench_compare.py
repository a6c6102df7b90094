"""The example ``kvserve bench compare`` on the benchmark model, in one command.

    python benchmarks/bench_compare.py                         # -> bench_results/compare-qwen-shaped/
    python benchmarks/bench_compare.py --out DIR --fresh       # measure everything again

Makes what the spec (``benchmarks/compare/qwen_shaped.yaml``) needs and is missing: the
Qwen2.5-0.5B-shaped checkpoint in ``/tmp/qwen-shaped`` (about a minute) and, when the llama.cpp
venv ``/tmp/llamacpp-venv`` has llama-cpp-python (``baseline_llamacpp.py`` says how to build it),
its bf16 GGUF file; without it the llama.cpp engine is skipped by its ``only_if`` and the report
says so. Then runs ``kvserve bench compare`` (resumable: a rerun keeps the finished cells). Run it
on a quiet machine: the servers and the client share its cores (docs/benchmarks.md section 5.7).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = HERE / "compare" / "qwen_shaped.yaml"
MODEL = "/tmp/qwen-shaped"
LLAMACPP_PYTHON = "/tmp/llamacpp-venv/bin/python"
_SCRIPT = Path(sys.executable).parent / "kvserve"
KVSERVE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "kvserve.cli"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_results/compare-qwen-shaped", help="output folder (resumable)")
    p.add_argument("--fresh", action="store_true", help="measure every cell and probe again")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from make_qwen_shaped_model import make_qwen_shaped_model

    make_qwen_shaped_model(MODEL)  # reuses a folder that already holds this shape and seed
    from baseline_llamacpp import ensure_gguf, llamacpp_versions

    try:
        print("llama.cpp venv:", llamacpp_versions(LLAMACPP_PYTHON))
        ensure_gguf(LLAMACPP_PYTHON, MODEL, Path(MODEL) / "model-bf16.gguf", "bf16")
    except (OSError, subprocess.CalledProcessError):
        print(f"no working llama-cpp-python at {LLAMACPP_PYTHON}: the llama.cpp engine will be skipped "
              "(baseline_llamacpp.py says how to build it)")
    command = [*KVSERVE, "bench", "compare", "--spec", str(SPEC), "--out", args.out, *(["--fresh"] * args.fresh)]
    print("+", " ".join(command), flush=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(command, env=env).returncode  # the spec's start commands find this venv's kvserve


if __name__ == "__main__":
    sys.exit(main())
