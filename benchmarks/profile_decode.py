"""Profile one decode step of the model runner at a given batch size.

Builds ``batch`` requests whose KV context is already "computed" (the cache holds zeros: the cost
of a decode step does not depend on the values), each at a different context length
(``context + i``, as in a real continuous batch), then times ``ModelExecutor.execute`` for
``--steps`` decode steps (forward + logits + greedy sampling) and prints torch.profiler's top
operators of one step.

    python benchmarks/profile_decode.py --model /tmp/qwen-shaped --batch 1 --batch 32 \
        --attention-backend torch --attention-backend cpu_paged

Each (backend, batch) pair is measured in the same process, so ratios between them are fair on a
shared, noisy machine; absolute times are not.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import time_calls

from kvserve.attention import get_attention_backend
from kvserve.engine.executor import ModelExecutor
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.output import ScheduledRequest, SchedulerOutput


def decode_batch(batch: int, context: int, block_size: int) -> SchedulerOutput:
    """``batch`` greedy requests, request i with ``context + i`` tokens, 1 new token each."""
    scheduled, next_block = [], 0
    for i in range(batch):
        length = context + i
        request = Request(f"r{i}", [1] * length, SamplingParams(temperature=0.0, max_tokens=10**6),
                          max_tokens=10**6)
        num_blocks = -(-length // block_size)
        block_ids = list(range(next_block, next_block + num_blocks))
        next_block += num_blocks
        scheduled.append(ScheduledRequest(request, length - 1, 1, block_ids))
    return SchedulerOutput(scheduled=scheduled, total_num_scheduled_tokens=batch)


def time_steps(executor: ModelExecutor, plan: SchedulerOutput, steps: int) -> list[float]:
    """Wall time of ``steps`` decode steps (the same plan re-run; the cache is overwritten in place)."""
    return time_calls(lambda: executor.execute(plan), steps)


def profile_step(executor: ModelExecutor, plan: SchedulerOutput, top: int) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        executor.execute(plan)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/tmp/qwen-shaped")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (repeatable; default 1 and 32)")
    parser.add_argument("--attention-backend", action="append", help="backends to compare (default: torch)")
    parser.add_argument("--context", type=int, default=192, help="tokens already in the cache per request")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's top operators")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--no-prepack", action="store_true", help="keep plain F.linear weights")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = args.batch or [1, 32]
    backends = args.attention_backend or ["torch"]
    for backend_name in backends:
        loaded = load_model(args.model, args.dtype, "cpu", get_attention_backend(backend_name))
        num_blocks = sum(-(-(args.context + i) // args.block_size) for i in range(max(batches))) + 1
        runner = ModelRunner(loaded, num_blocks, args.block_size, prepack_linears=not args.no_prepack)
        executor = ModelExecutor(runner, loaded.arch.vocab_size)
        for batch in batches:
            plan = decode_batch(batch, args.context, args.block_size)
            times = time_steps(executor, plan, args.steps)
            median = statistics.median(times)
            print(f"backend={backend_name} prepacked={runner.num_prepacked_linears} dtype={loaded.dtype} batch={batch} context={args.context}: "
                  f"step median {median * 1e3:.1f} ms (min {min(times) * 1e3:.1f}), "
                  f"{batch / median:.1f} tok/s", flush=True)
            if args.profile:
                print(profile_step(executor, plan, args.top), flush=True)
        del executor, runner, loaded


if __name__ == "__main__":
    main()
