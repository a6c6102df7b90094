"""Profile one decode step of the model runner at a given batch size.

Builds ``batch`` requests whose KV context is already "computed" (the cache holds zeros: the cost
of a decode step does not depend on the values), each at a different context length
(``context + i``, as in a real continuous batch), hands them to the model runner once, then times
``ModelRunner.execute_model`` for ``--steps`` decode steps (the persistent batch's deltas, forward,
logits, greedy sampling) and prints torch.profiler's top operators of one step.

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
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner
from kvserve.sampling_params import SamplingParams
from kvserve.request import Request
from kvserve.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput


class DecodeSteps:
    """``batch`` greedy requests, request i with ``context + i`` tokens, held by ``runner``; each
    call runs one decode step (1 new token each) and advances the contexts, so ``steps`` calls
    need ``context + steps`` tokens of blocks per request (allocated up front)."""

    def __init__(self, runner: ModelRunner, batch: int, context: int, block_size: int, steps: int):
        self.runner = runner
        params = SamplingParams(temperature=0.0, max_tokens=10**6)
        news, next_block = [], 1
        for i in range(batch):
            length = context + i
            num_blocks = -(-(length + steps + 2) // block_size)
            blocks = list(range(next_block, next_block + num_blocks))
            next_block += num_blocks
            spec = Request.of(f"r{i}", [1] * length, params, max_tokens=10**6).spec
            news.append(NewRequestData(spec, [], blocks, length - 1))
        self.computed = [new.num_computed_tokens for new in news]
        self.ids = [new.req_id for new in news]
        runner.execute_model(SchedulerOutput(news, CachedRequestData(), dict.fromkeys(self.ids, 1), batch))
        self.computed = [c + 1 for c in self.computed]

    def __call__(self) -> None:
        cached = CachedRequestData(list(self.ids), [[] for _ in self.ids], list(self.computed))
        self.runner.execute_model(SchedulerOutput([], cached, dict.fromkeys(self.ids, 1), len(self.ids)))
        self.computed = [c + 1 for c in self.computed]

    def finish(self) -> None:
        """Drop the requests from the runner (so another batch can use it)."""
        self.runner.execute_model(SchedulerOutput(finished_req_ids=set(self.ids)))


def blocks_needed(batches: list[int], context: int, block_size: int, steps: int) -> int:
    return 2 + sum(-(-(context + i + steps + 2) // block_size) for i in range(max(batches)))


def time_steps(step: DecodeSteps, steps: int) -> list[float]:
    """Wall time of ``steps`` decode steps."""
    return time_calls(step, steps)


def profile_step(step: DecodeSteps, top: int) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
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
        num_blocks = blocks_needed(batches, args.context, args.block_size, 2 * args.steps + 4)
        runner = ModelRunner(loaded, num_blocks, args.block_size, prepack_linears=not args.no_prepack,
                             max_num_reqs=max(batches), max_model_len=args.context + max(batches) + 2 * args.steps + 8)
        for batch in batches:
            step = DecodeSteps(runner, batch, args.context, args.block_size, 2 * args.steps + 4)
            times = time_steps(step, args.steps)
            median = statistics.median(times)
            print(f"backend={backend_name} prepacked={runner.num_prepacked_linears} dtype={loaded.dtype} batch={batch} context={args.context}: "
                  f"step median {median * 1e3:.1f} ms (min {min(times) * 1e3:.1f}), "
                  f"{batch / median:.1f} tok/s", flush=True)
            if args.profile:
                print(profile_step(step, args.top), flush=True)
            step.finish()
        del runner, loaded


if __name__ == "__main__":
    main()
