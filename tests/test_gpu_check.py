"""The GPU check's CPU half: ``scripts/gpu_check.sh --dry-run`` runs every section (Triton attention,
elementwise, sampling, quantized-linear and MoE kernels under the interpreter, engine parity CPU against CPU and transformers, the benchmark code on a
tiny dummy-weight model) and writes its JSON, so the check is ready the day a GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_dry_run_runs_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert set(results) == {"environment", "attention", "elementwise", "sampler", "quant", "moe", "engine_parity",
                            "benchmarks"}
    assert not [name for name, r in results.items() if "error" in r], results
    assert results["attention"]["ok"] and results["elementwise"]["ok"] and results["sampler"]["ok"]
    assert results["quant"]["ok"] and results["moe"]["ok"] and results["engine_parity"]["ok"]
    assert results["environment"]["dry_run"] and results["benchmarks"]["shape"] == "tiny (dry run)"
    assert results["benchmarks"]["batch1_step_ms"] > 0
