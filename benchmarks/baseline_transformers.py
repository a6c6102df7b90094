"""Baseline: Hugging Face transformers ``generate`` on the same workload as ``kvserve bench``.

    python benchmarks/baseline_transformers.py --model /tmp/qwen-shaped --mode sequential --num-prompts 4
    python benchmarks/baseline_transformers.py --model /tmp/qwen-shaped --mode static --batch-size 32 \
        --num-prompts 32 --result-file bench_results/hf-static32.json

Modes:
    sequential  one request at a time (batch 1); each request's TTFT and E2E latency are timed
                from its own start. Comparable to ``kvserve bench serve --max-concurrency 1``.
    static      fixed batches of ``--batch-size`` prompts, left-padded, run to the end before the
                next batch starts (no continuous batching). Every request in a batch is timed
                from the batch's start. Comparable to ``--max-concurrency BATCH_SIZE``.

Greedy decoding; ``min_new_tokens = max_new_tokens = --output-len`` forces exactly that many
tokens (ignore_eos). TTFT is the time at which ``generate`` hands the first new token to its
streamer. Weights in the checkpoint's dtype (``--dtype`` to change), the default torch thread
count. One warm-up generate of 4 tokens runs before timing.
"""

from __future__ import annotations

import argparse
import sys
import time

from baseline_common import RequestTiming, load_workload, package_versions, print_summary, summarize, write_baseline


class FirstTokenClock:
    """A ``generate`` streamer that records when the first new token arrives (perf_counter s).

    ``generate`` calls ``put`` once with the prompt ids, then once per decoding step."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_token_time: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first_token_time is None:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


def load_model(model_dir: str, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = {} if dtype == "auto" else {"dtype": getattr(torch, dtype)}
    if dtype == "auto":
        kwargs["dtype"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, **kwargs)
    return model.eval()


def run_batch(model, prompts: list[list[int]], output_len: int, pad_id: int) -> tuple[list[RequestTiming], float]:
    """Generate ``output_len`` tokens for every prompt in one left-padded batch.

    Returns:
        The timings of the batch's requests and the batch's wall time (s).
    """
    import torch

    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    clock = FirstTokenClock()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=output_len,
                             min_new_tokens=output_len, do_sample=False, pad_token_id=pad_id, streamer=clock)
    elapsed = time.perf_counter() - start
    new_tokens = out.shape[1] - width
    if new_tokens != output_len:
        raise RuntimeError(f"generate returned {new_tokens} new tokens, expected {output_len}")
    ttft = (clock.first_token_time or start + elapsed) - start
    return [RequestTiming(ttft, elapsed, new_tokens) for _ in prompts], elapsed


def run(args: argparse.Namespace) -> dict:
    samples = load_workload(args.tokenizer or args.model, args.num_prompts, args.input_len, args.output_len, args.seed)
    model = load_model(args.model, args.dtype)
    pad_id = model.generation_config.pad_token_id
    pad_id = 0 if pad_id is None else int(pad_id if isinstance(pad_id, int) else pad_id[0])
    run_batch(model, [samples[0].prompt_token_ids], 4, pad_id)  # warm-up
    batch_size = 1 if args.mode == "sequential" else args.batch_size
    timings: list[RequestTiming] = []
    start = time.perf_counter()
    for i in range(0, len(samples), batch_size):
        batch = [s.prompt_token_ids for s in samples[i:i + batch_size]]
        batch_timings, _ = run_batch(model, batch, args.output_len, pad_id)
        timings.extend(batch_timings)
    duration = time.perf_counter() - start
    return summarize(timings, duration, sum(s.prompt_len for s in samples))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="transformers generate baseline (sequential or static batches)")
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: --model)")
    p.add_argument("--mode", choices=("sequential", "static"), default="sequential")
    p.add_argument("--batch-size", type=int, default=32, help="static mode: prompts per batch")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="workload seed, as kvserve bench --seed")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    p.add_argument("--result-file", default=None)
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.num_prompts < 1:
        p.error("--batch-size and --num-prompts must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    metrics = run(args)
    label = "sequential" if args.mode == "sequential" else f"static batch {args.batch_size}"
    print_summary(f"transformers generate, {label}", metrics)
    if args.result_file:
        settings = {"mode": args.mode, "batch_size": 1 if args.mode == "sequential" else args.batch_size,
                    "dtype": args.dtype, "model": args.model}
        workload = {"dataset_name": "random", "num_prompts": args.num_prompts, "input_len": args.input_len,
                    "output_len": args.output_len, "seed": args.seed, "ignore_eos": True}
        path = write_baseline(args.result_file, f"transformers-{args.mode}", settings, workload, metrics,
                              package_versions("transformers", "torch", "tokenizers"))
        print(f"result written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
