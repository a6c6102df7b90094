"""Cost of the scheduler and of input preparation per engine step in steady decode.

Admits ``--num-requests`` requests, prefills them in one step, then times ``--steps`` decode steps
of ``Scheduler.schedule()``, the model runner's input preparation (applying the step's deltas to
its persistent batch, the flat batch with positions, slot mapping, block tables and attention
metadata on the device, and the sampler's metadata) and ``Scheduler.update_from_output()`` with
fake sampled tokens (the forward pass itself is not run; the fake tokens are appended to the
runner's batch as a real step would). Prints microseconds per step (median and mean) per part.

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
    params = SamplingParams(max_tokens=args.steps + 8, ignore_eos=True, temperature=args.temperature)
    for index in range(args.num_requests):
        prompt = [(index * 7919 + position) % 32000 for position in range(args.prompt_len)]
        scheduler.add_request(Request.of(f"req-{index}", prompt, params, max_tokens=args.steps + 8))
    return scheduler


def fake_runner_output(scheduler_output, step: int) -> ModelRunnerOutput:
    """A token for every scheduled request (each reaches the end of its tokens in these steps)."""
    sampled = {req_id: [(step * 31 + index) % 32000] for index, req_id in enumerate(scheduler_output.num_scheduled_tokens)}
    return ModelRunnerOutput(sampled_token_ids=sampled)


def make_input_preparer(scheduler: Scheduler, block_size: int, max_model_len: int):
    """A model runner over a tiny random checkpoint (only its input preparation is timed) and
    two functions: ``prepare(scheduler_output)`` (what the runner does before its forward pass)
    and ``commit(runner_output)`` (append the step's tokens to its batch, untimed)."""
    import tempfile

    import numpy as np

    from kvserve.model.loader import load_model
    from kvserve.model.model_inputs import to_model_inputs
    from kvserve.model.runner import ModelRunner
    from kvserve.outputs import ModelRunnerOutput
    from kvserve.testing.checkpoints import build_checkpoint

    folder = build_checkpoint(tempfile.mkdtemp(prefix="kvserve-bench-"), "LlamaForCausalLM", "bpe")
    loaded = load_model(folder)
    runner = ModelRunner(loaded, scheduler.kv_cache_manager.block_pool.num_blocks, block_size,
                         max_num_reqs=scheduler.scheduler_config.max_num_seqs, max_model_len=max_model_len)

    def prepare(scheduler_output) -> None:
        runner._update_states(scheduler_output, ModelRunnerOutput())
        batch = runner.input_batch
        rows = np.arange(batch.num_reqs)
        num_scheduled = np.array([scheduler_output.num_scheduled_tokens[r] for r in batch.req_ids], dtype=np.int64)
        samples = (batch.num_computed_tokens[rows] + num_scheduled >= batch.num_tokens[rows]) & (batch.max_tokens[rows] > 0)
        to_model_inputs(runner._flat_batch(rows, num_scheduled, samples), runner.device)
        batch.sampling_metadata(rows[samples], runner._uniforms(rows[samples]))

    def commit(runner_output) -> None:
        batch = runner.input_batch
        for req_id, tokens in runner_output.sampled_token_ids.items():
            batch.append_token(batch.req_id_to_index[req_id], tokens[0])

    return prepare, commit


def run(args: argparse.Namespace) -> None:
    scheduler = build(args)
    prepare, commit = make_input_preparer(scheduler, args.block_size, scheduler.scheduler_config.max_model_len)
    first = scheduler.schedule()  # prefill of every request (not timed)
    prepare(first)
    first_output = fake_runner_output(first, 0)
    commit(first_output)
    scheduler.update_from_output(first, first_output)
    schedule_us, prepare_us, update_us = [], [], []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        scheduler_output = scheduler.schedule()
        scheduled = time.perf_counter()
        prepare(scheduler_output)
        prepared = time.perf_counter()
        runner_output = fake_runner_output(scheduler_output, step)  # the model's share: not timed
        commit(runner_output)
        resumed = time.perf_counter()
        scheduler.update_from_output(scheduler_output, runner_output)
        end = time.perf_counter()
        assert len(scheduler_output.num_scheduled_tokens) == args.num_requests, "every request decodes every step"
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
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of every request")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
