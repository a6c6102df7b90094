"""Multi-LoRA serving cost: requests spread over 8 adapters vs the base model, one server, one run.

    python benchmarks/lora.py                       # model /tmp/qwen-shaped, results in bench_results/lora-TIME/
    python benchmarks/lora.py --prompts-c32 64 --prompts-c1 4 --output-len 64

Writes 8 rank-16 PEFT adapters (q/k/v/o/gate/up/down, random weights, ``adapter_config.json`` +
``adapter_model.safetensors`` as ``peft`` saves them) for the Qwen2.5-0.5B-shaped model
(``benchmarks/make_qwen_shaped_model.py``), starts ``kvserve serve MODEL --enable-lora --max-loras 8
--max-lora-rank 16 --lora-modules a0=... a7=...`` and runs ``kvserve bench serve`` (closed loop,
random 128-token prompts, ignore_eos, greedy) four times against it:

    base-c32   the base model at concurrency 32
    lora-c32   the same prompts spread round-robin over the 8 adapters (every step mixes 8)
    base-c1    the base model at concurrency 1
    lora-c1    one adapter at concurrency 1

Targets (issue 17): lora-c32 throughput >= 0.80 x base-c32; lora-c1 TPOT <= 1.15 x base-c1. The
summary (``summary.json``, printed as a table) gives the ratios; the result files carry each run's
provenance. Run with nothing else on the machine (``flock -x /tmp/kvserve-cpu.lock ...``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from servers import bench_serve, kvserve_server  # noqa: E402

MODULES = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def write_adapter(folder: Path, config: dict, rank: int, seed: int) -> None:
    """A PEFT LoRA folder for a Qwen2 ``config`` on every projection, random A and B."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
              "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for parent, names in MODULES.items():
            for name in names:
                fan_in, fan_out = shapes[name]
                prefix = f"base_model.model.model.layers.{layer}.{parent}.{name}"
                tensors[f"{prefix}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=generator)
                                                      / fan_in**0.5).to(torch.bfloat16)
                tensors[f"{prefix}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=generator)
                                                      / rank**0.5 * 0.1).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "use_rslora": False,
                      "target_modules": [n for names in MODULES.values() for n in names], "bias": "none",
                      "task_type": "CAUSAL_LM", "base_model_name_or_path": config.get("_name_or_path", "")}
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))


def workload(args, num_prompts: int, seed: int) -> list[str]:
    return ["--dataset-name", "random", "--input-len", str(args.input_len), "--output-len", str(args.output_len),
            "--num-prompts", str(num_prompts), "--seed", str(seed), "--temperature", "0"]


def figures(doc: dict) -> dict:
    m = doc["metrics"]
    return {"tok_s": m["output_throughput"], "tpot_ms": m["tpot_ms"]["median"], "ttft_ms": m["ttft_ms"]["median"],
            "completed": m["completed"], "failed": m["failed"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="/tmp/qwen-shaped")
    parser.add_argument("--out", default=None)
    parser.add_argument("--num-adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompts-c32", type=int, default=64)
    parser.add_argument("--prompts-c1", type=int, default=4)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--server-flags", default="", help="extra kvserve serve flags")
    args = parser.parse_args(argv)
    out = Path(args.out or f"bench_results/lora-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((Path(args.model) / "config.json").read_text())
    names = [f"a{i}" for i in range(args.num_adapters)]
    for i, name in enumerate(names):
        folder = out / "adapters" / name
        if not (folder / "adapter_config.json").exists():
            write_adapter(folder, config, args.rank, seed=i)
    extra = ["--enable-lora", "--max-loras", str(args.num_adapters), "--max-lora-rank", str(args.rank),
             "--lora-modules", *[f"{n}={out / 'adapters' / n}" for n in names], *args.server_flags.split()]
    docs = {}
    with kvserve_server(args.model, out / "server.log", extra=extra) as url:
        runs = [("base-c32", 32, args.prompts_c32, []),
                ("lora-c32", 32, args.prompts_c32, ["--lora-modules", *names, "--lora-assignment", "round-robin"]),
                ("base-c1", 1, args.prompts_c1, []),
                ("lora-c1", 1, args.prompts_c1, ["--lora-modules", names[0]])]
        for label, concurrency, prompts, flags in runs:
            docs[label] = bench_serve(url, args.model, out / f"{label}.json", workload(args, prompts, 1000 + concurrency),
                                      concurrency, num_warmups=2, extra=flags)
    f = {label: figures(doc) for label, doc in docs.items()}
    summary = {
        "runs": f,
        "c32_throughput_ratio": f["lora-c32"]["tok_s"] / f["base-c32"]["tok_s"],
        "c1_tpot_ratio": f["lora-c1"]["tpot_ms"] / f["base-c1"]["tpot_ms"],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\n| run | output tok/s | TPOT p50 ms | TTFT p50 ms | completed | failed |\n|---|---|---|---|---|---|")
    for label, fig in f.items():
        print(f"| {label} | {fig['tok_s']:.1f} | {fig['tpot_ms']:.1f} | {fig['ttft_ms']:.0f} | {fig['completed']} "
              f"| {fig['failed']} |")
    print(f"\nc32 throughput, 8 adapters / base: {summary['c32_throughput_ratio']:.3f} (target >= 0.80)")
    print(f"c1 TPOT, one adapter / base: {summary['c1_tpot_ratio']:.3f} (target <= 1.15)")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
