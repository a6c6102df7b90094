"""One decode step with LoRA adapters vs without, in the model runner (no server, no scheduler).

    python benchmarks/lora_step.py [--model /tmp/qwen-shaped] [--batch 32] [--adapters 8] [--rank 16]

Times ``ModelRunner.forward`` of ``--batch`` requests decoding one token each at context
``--context`` on the Qwen2.5-0.5B-shaped model (bf16): the base model, the same rows spread
round-robin over ``--adapters`` adapters, and one adapter for every row. Median of ``--repeats``
after two warm-ups. Run with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from lora import write_adapter  # noqa: E402

from kvserve.config import LoRAConfig  # noqa: E402
from kvserve.lora.request import LoRARequest  # noqa: E402
from kvserve.model.loader import load_model  # noqa: E402
from kvserve.model.runner import ModelRunner  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/qwen-shaped")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--context", type=int, default=192)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--adapter-dir", default="/tmp/kvserve-lora-step-adapters")
    args = p.parse_args(argv)
    import json

    config = json.loads((Path(args.model) / "config.json").read_text())
    loras = []
    for i in range(args.adapters):
        folder = Path(args.adapter_dir) / f"a{i}"
        if not (folder / "adapter_config.json").exists():
            write_adapter(folder, config, args.rank, seed=i)
        loras.append(LoRARequest(f"a{i}", i + 1, str(folder)))
    block = 16
    blocks_per_req = -(-(args.context + 1) // block)
    runner = ModelRunner(load_model(args.model, "bfloat16"), num_blocks=args.batch * blocks_per_req + 1,
                         block_size=block, lora_config=LoRAConfig(max_loras=args.adapters, max_lora_rank=args.rank))
    tokens = [[(i * 31 + k) % 1000 + 10 for k in range(args.context + 1)] for i in range(args.batch)]
    tables = [list(range(1 + i * blocks_per_req, 1 + (i + 1) * blocks_per_req)) for i in range(args.batch)]
    computed = [args.context] * args.batch
    cases = {
        "base": None,
        f"{args.adapters} adapters": [loras[i % len(loras)] for i in range(args.batch)],
        "1 adapter": [loras[0]] * args.batch,
    }
    results = {}
    for name, assignment in cases.items():
        times = []
        for i in range(args.repeats + 2):
            start = time.perf_counter()
            runner.forward(tokens, tables, computed, lora_requests=assignment)
            if i >= 2:
                times.append(time.perf_counter() - start)
        results[name] = statistics.median(times)
    base = results["base"]
    print(f"batch {args.batch}, context {args.context}, rank {args.rank}, threads {torch.get_num_threads()}")
    for name, seconds in results.items():
        print(f"  {name:12s} {seconds * 1e3:8.2f} ms  {seconds / base:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
