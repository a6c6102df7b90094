"""Cost of the scheduler and of input preparation per engine step in steady decode.

Admits ``--num-requests`` requests, prefills them in one step, then times ``--steps`` decode steps
of ``Scheduler.schedule()``, the model runner's input preparation (``ModelRunner.prepare_inputs``:
flat batch, positions, slot mapping, block tables, attention metadata) plus
``SamplingMetadata.build``, and ``Scheduler.update_from_output()`` with fake sampled tokens (the
forward pass itself is not run). Prints microseconds per step (median and mean) for each part.

    python benchmarks/scheduler_step.py --num-requests 256 --steps 300
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvserve.config import SchedulerConfig
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.outputs import ModelRunnerOutput
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.scheduler import Scheduler


def build(args: argparse.Namespace) -> Scheduler:
    max_model_len = args.prompt_len + args.steps + 8
    blocks_per_request = -(-max_model_len // args.block_size)
    manager = KVCacheManager(args.num_requests * blocks_per_request + 1, args.block_size, not args.no_prefix_caching)
    config = SchedulerConfig(
        max_num_batched_tokens=args.num_requests * args.prompt_len,
        max_num_seqs=args.num_requests,
        max_model_len=max_model_len,
    )
    scheduler = Scheduler(config, manager)
    params = SamplingParams(max_tokens=args.steps + 8, ignore_eos=True)
    for index in range(args.num_requests):
        prompt = [(index * 7919 + position) % 32000 for position in range(args.prompt_len)]
        scheduler.add_request(Request(f"req-{index}", prompt, params, max_tokens=args.steps + 8))
    return scheduler


def fake_runner_output(scheduler_output, step: int) -> ModelRunnerOutput:
    scheduled = scheduler_output.scheduled
    sampled = {s.request_id: (step * 31 + index) % 32000 for index, s in enumerate(scheduled) if s.samples}
    return ModelRunnerOutput(sampled_token_ids=sampled)


def make_input_preparer(scheduler: Scheduler, block_size: int):
    """A model runner over a tiny random checkpoint (only its input preparation is timed) and a
    function preparing one step's inputs and sampling metadata."""
    import tempfile

    from kvserve.model.loader import load_model
    from kvserve.model.runner import ModelRunner
    from kvserve.sample.metadata import SamplingMetadata
    from kvserve.testing.checkpoints import build_checkpoint

    folder = build_checkpoint(tempfile.mkdtemp(prefix="kvserve-bench-"), "LlamaForCausalLM", "bpe")
    loaded = load_model(folder)
    runner = ModelRunner(loaded, scheduler.kv_cache_manager.block_pool.num_blocks, block_size)

    def prepare(scheduler_output) -> None:
        runner.prepare_inputs(scheduler_output)
        sampling = [s.request for s in scheduler_output.scheduled if s.samples]
        SamplingMetadata.build(sampling, [None] * len(sampling), 32000, "cpu")

    return prepare


def run(args: argparse.Namespace) -> None:
    scheduler = build(args)
    prepare = make_input_preparer(scheduler, args.block_size)
    first = scheduler.schedule()  # prefill of every request (not timed)
    scheduler.update_from_output(first, fake_runner_output(first, 0))
    schedule_us, prepare_us, update_us = [], [], []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        scheduler_output = scheduler.schedule()
        scheduled = time.perf_counter()
        prepare(scheduler_output)
        prepared = time.perf_counter()
        runner_output = fake_runner_output(scheduler_output, step)  # the model's share: not timed
        resumed = time.perf_counter()
        scheduler.update_from_output(scheduler_output, runner_output)
        end = time.perf_counter()
        assert len(scheduler_output.scheduled) == args.num_requests, "every request decodes every step"
        schedule_us.append((scheduled - start) * 1e6)
        prepare_us.append((prepared - scheduled) * 1e6)
        update_us.append((end - resumed) * 1e6)
    total_us = [a + b + c for a, b, c in zip(schedule_us, prepare_us, update_us)]
    print(f"{args.num_requests} running requests, {args.steps} decode steps, block_size {args.block_size}, "
          f"prefix caching {'off' if args.no_prefix_caching else 'on'}")
    parts = (("schedule()", schedule_us), ("input preparation", prepare_us),
             ("update_from_output()", update_us), ("total", total_us))
    for name, values in parts:
        median, mean = statistics.median(values), statistics.fmean(values)
        print(f"  {name:22s} median {median:8.1f} us/step   mean {mean:8.1f} us/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--no-prefix-caching", action="store_true")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
