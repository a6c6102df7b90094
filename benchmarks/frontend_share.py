"""How much of an engine step the front end (detokenization, stop strings, delta outputs) takes,
to decide whether it should leave the engine thread.

Runs ``--num-prompts`` requests through ``LLMEngine`` at once (offline, no HTTP) and times, per
step, ``EngineCore.step()`` (schedule + model + update) and ``OutputProcessor.process_outputs``
(the front end). Prints the medians and the front end's share of the step.

    python benchmarks/frontend_share.py --num-prompts 64 --output-len 64
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvserve import SamplingParams
from kvserve.builtin import builtin_model_path
from kvserve.engine.arg_utils import engine_config_from_kwargs
from kvserve.engine.llm_engine import LLMEngine


def run(args: argparse.Namespace) -> None:
    model = args.model or str(builtin_model_path())
    engine = LLMEngine(engine_config_from_kwargs(model, max_num_seqs=args.num_prompts, dtype=args.dtype))
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=args.output_len, ignore_eos=True,
                            stop=["zzzzzz"] if args.stop else [])
    prompt = "It is a truth universally acknowledged, that a single man in possession of a good fortune"
    for i in range(args.num_prompts):
        engine.add_request(str(i), prompt, params)
    core_times, front_times = [], []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        result = engine.core.step()
        middle = time.perf_counter()
        processed = engine.output_processor.process_outputs(result.outputs)
        end = time.perf_counter()
        processed.finish_in(engine.core)
        if result.stats is not None and result.stats.num_decode_tokens == args.num_prompts:
            core_times.append(middle - start)
            front_times.append(end - middle)
    core, front = statistics.median(core_times), statistics.median(front_times)
    print(f"{args.num_prompts} requests x {args.output_len} tokens, model {model}, {len(core_times)} decode steps")
    print(f"  engine core step   median {core * 1e3:8.2f} ms")
    print(f"  front end          median {front * 1e3:8.2f} ms  ({front / (core + front):.1%} of the step)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the built-in model)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--stop", action="store_true", help="give every request a stop string to match")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
