"""Tensor parallelism on this machine: what the ranks' communication costs per step and layer,
what each rank holds, and a decode step at TP 1 vs TP 2.

    python benchmarks/tensor_parallel.py [--model /tmp/qwen-shaped] [--out bench_results/tensor_parallel.json]

Three parts, each in fresh processes (gloo on 127.0.0.1, every rank pinned to its own core with
one thread, as ``-tp 2`` runs them):

1. Collectives, two ranks: one all-reduce of a [rows, hidden] activation (what o_proj and
   down_proj each do per layer; rows = 1, 16, 64 decode rows, 512 prefill rows) in bfloat16 and
   float32; the LM head's exchange (the [rows, hidden] broadcast and the gather of [rows,
   vocab / 2] bf16 logits on rank 0); and the per-call message of a decode step's ``Forward`` (batch 1 and 64, blocks of 16
   at context 128): kvserve's framed broadcast (``Communicator.send_message``: one 4 KiB
   broadcast) against ``torch.distributed.broadcast_object_list`` (a size broadcast, then the
   pickle). Median of ``--repeats`` after 5 warm-ups, timed on rank 0.
2. Memory per rank: the shard's parameter bytes (``load_shard``) and the process's RSS growth
   while loading, against the whole model's bytes (the checkpoint's tensors) and a TP 1 process
   loading it (``load_model``; a tied embedding counts once).
3. Decode step, ``ModelRunner.forward`` of ``--batch`` rows at context ``--context`` (bf16), in
   an engine of TP 1 (2 threads) and of TP 2 (1 thread per rank), median of ``--repeats``.

Run with nothing else on the machine (the exclusive CPU lock).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from timing import time_calls  # noqa: E402

ROWS = (1, 16, 64, 512)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _median_us(fn, repeats: int) -> float:
    """Median microseconds of ``repeats`` calls (after warm-up calls, several for collectives)."""
    for _ in range(4):
        fn()
    return statistics.median(time_calls(fn, repeats)) * 1e6


def _forward_message(batch: int, context: int, block: int = 16):
    from kvserve.distributed.messages import Forward
    from kvserve.model.model_inputs import make_flat_batch, to_model_inputs
    import numpy as np

    width = -(-(context + 1) // block)
    tokens = np.arange(batch * (context + 1)).reshape(batch, context + 1) % 1000
    tables = np.arange(batch * width).reshape(batch, width) + 1
    flat = make_flat_batch(tokens, np.full(batch, context), np.ones(batch, dtype=np.int64), tables, block,
                           np.ones(batch, dtype=bool))
    inputs = to_model_inputs(flat, torch.device("cpu"))
    return Forward.of(inputs.input_ids, inputs.positions, inputs.attn_metadata)


def _rank(rank: int, port: int, model: str, hidden: int, vocab: int, repeats: int, results) -> None:
    """One of the two ranks of parts 1 and 2."""
    import psutil
    import torch.distributed as dist

    from kvserve.attention import get_attention_backend
    from kvserve.distributed.communicator import Communicator, make_store
    from kvserve.distributed.loader import load_shard

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % os.cpu_count()]})
    torch.set_num_threads(1)
    store = make_store("127.0.0.1", port, rank, 2, 60)
    comm = Communicator(store, rank, 2, torch.device("cpu"), 60)
    dist.init_process_group("gloo", store=dist.PrefixStore("default", store), rank=rank, world_size=2)
    out = {"all_reduce_us": {}, "message_us": {}}
    for dtype in (torch.bfloat16, torch.float32):
        for rows in ROWS:
            x = torch.randn(rows, hidden).to(dtype)
            out["all_reduce_us"][f"{str(dtype).removeprefix('torch.')} x{rows}"] = _median_us(
                lambda x=x: comm.all_reduce(x), repeats)
    out["logits_gather_us"] = {}
    vocab_shard = -(-vocab // 2)
    for rows in (1, 16, 64):
        logits = torch.randn(rows, vocab_shard).to(torch.bfloat16)
        hidden_rows = torch.randn(rows, hidden).to(torch.bfloat16)
        out["logits_gather_us"][f"bfloat16 x{rows}"] = _median_us(
            lambda lg=logits, h=hidden_rows: (comm.broadcast(h), comm.gather(lg)), repeats)
    for batch in (1, 64):
        message = _forward_message(batch, 128)
        size = len(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        framed = (lambda m=message: comm.send_message(m)) if rank == 0 else comm.receive_message
        obj_list = [message if rank == 0 else None]
        out["message_us"][f"batch {batch} ({size} B)"] = {
            "framed": _median_us(framed, repeats),
            "broadcast_object_list": _median_us(lambda: dist.broadcast_object_list(obj_list, src=0), repeats),
        }
    backend = get_attention_backend("auto", "cpu")  # builds/loads the kernels before the RSS baseline
    rss = psutil.Process().memory_info().rss
    loaded = load_shard(model, torch.bfloat16, torch.device("cpu"), backend, rank, comm)
    out["shard_bytes"] = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    out["load_rss_growth"] = psutil.Process().memory_info().rss - rss
    dist.barrier()
    results.put((rank, out))
    dist.destroy_process_group()
    comm.close()


def collectives_and_memory(model: str, hidden: int, vocab: int, repeats: int) -> dict:
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    procs = [context.Process(target=_rank, args=(r, port, model, hidden, vocab, repeats, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=900) for _ in procs)
    for p in procs:
        p.join(60)
    return got


def _full_load(model: str, results) -> None:
    """The whole model in one process (TP 1): parameter bytes and RSS growth while loading."""
    import psutil

    from kvserve.attention import get_attention_backend
    from kvserve.model.loader import load_model

    backend = get_attention_backend("auto", "cpu")
    rss = psutil.Process().memory_info().rss
    loaded = load_model(model, torch.bfloat16, "cpu", backend)
    results.put({"bytes": sum(p.numel() * p.element_size() for p in loaded.model.parameters()),
                 "load_rss_growth": psutil.Process().memory_info().rss - rss})


def full_load(model: str) -> dict:
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_full_load, args=(model, results))
    process.start()
    got = results.get(timeout=600)
    process.join(60)
    return got


def checkpoint_bytes(model: str) -> int:
    from safetensors import safe_open

    total = 0
    for path in sorted(Path(model).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                total += torch.Size(piece.get_shape()).numel() * 2  # bfloat16
    return total


def decode_steps(model: str, tp: int, batch: int, context: int, repeats: int) -> float:
    """Median seconds of one decode step in an engine of ``tp`` ranks."""
    from kvserve.engine.llm import LLM

    block = 16
    per_req = -(-(context + 1) // block)
    llm = LLM(model, dtype="bfloat16", max_model_len=context + 16, num_gpu_blocks_override=batch * per_req + 1,
              block_size=block, tensor_parallel_size=tp, cpu_threads=2 if tp == 1 else "auto")
    try:
        runner = llm.llm_engine.core.runner
        tokens = [[(i * 31 + k) % 1000 + 10 for k in range(context + 1)] for i in range(batch)]
        tables = [list(range(1 + i * per_req, 1 + (i + 1) * per_req)) for i in range(batch)]
        runner.forward([t[:context] for t in tokens], tables)  # fill the KV cache
        return _median_us(lambda: runner.forward(tokens, tables, [context] * batch), repeats) / 1e6
    finally:
        llm.shutdown()


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="/tmp/qwen-shaped")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--out", default="bench_results/tensor_parallel.json")
    args = p.parse_args(argv)
    from kvserve.bench.provenance import collect_provenance
    from kvserve.model.arch_config import ModelArchConfig

    arch = ModelArchConfig.from_file(Path(args.model) / "config.json")
    result = {"provenance": collect_provenance(None).__dict__, "model": args.model,
              "cpu_flags": sorted({f for f in Path("/proc/cpuinfo").read_text().split()
                                   if f.startswith(("amx", "avx512_bf16", "avx512f"))})}
    ranks = collectives_and_memory(args.model, arch.hidden_size, arch.vocab_size, args.repeats)
    result["ranks"] = ranks
    full = checkpoint_bytes(args.model)
    result["model_bytes"] = full
    result["tp1_load"] = full_load(args.model)
    print(f"whole model {full / 2**20:.1f} MiB (bf16); TP 1 process: parameters "
          f"{result['tp1_load']['bytes'] / 2**20:.1f} MiB, RSS growth while loading "
          f"{result['tp1_load']['load_rss_growth'] / 2**20:.1f} MiB")
    for rank, out in sorted(ranks.items()):
        print(f"rank {rank}: shard {out['shard_bytes'] / 2**20:.1f} MiB = {out['shard_bytes'] / full:.4f} of the "
              f"model; RSS growth while loading {out['load_rss_growth'] / 2**20:.1f} MiB")
    print("all-reduce [rows, hidden], rank 0 (us):", json.dumps(ranks[0]["all_reduce_us"], indent=1))
    print("message per model call, rank 0 (us):", json.dumps(ranks[0]["message_us"], indent=1))
    print("LM head: hidden broadcast + logits gather, rank 0 (us):", json.dumps(ranks[0]["logits_gather_us"], indent=1))
    steps = {}
    for batch in args.batch:
        for tp in (1, 2):
            steps[f"tp{tp} batch {batch}"] = decode_steps(args.model, tp, batch, args.context, args.repeats)
            print(f"decode step TP {tp}, batch {batch}: {steps[f'tp{tp} batch {batch}'] * 1e3:.2f} ms")
    result["decode_step_s"] = steps
    from roofline import decode_bound, measure_peaks

    peaks = measure_peaks(arch)
    import dataclasses

    bounds = {b: decode_bound(arch, peaks, b, args.context, torch.bfloat16) for b in args.batch}
    result["roofline"] = {str(b): {**dataclasses.asdict(bound), "bound_s": bound.bound_s}
                          for b, bound in bounds.items()}
    result["peaks"] = dataclasses.asdict(peaks)
    print("roofline:", json.dumps(result["roofline"], indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
