"""What of ``vllm bench serve`` kvserve does not do, and why: flags, backends and datasets.

A command line naming one of these fails with one line that names it and gives the reason, rather
than running a different benchmark than the one asked for. Everything else of ``vllm bench
serve`` is implemented (see ``docs/bench.md``).
"""

from __future__ import annotations

import argparse

from kvserve.errors import InvalidRequestError

_MULTIMODAL = "kvserve serves text models only (no image, video or audio inputs)"
_POOLING = "kvserve serves no embeddings, pooling or rerank API"
_HF = "loading Hugging Face Hub datasets is not implemented (no network in kvserve's setting)"

# flag -> (argparse nargs: 0 = a switch, None = one value, "*"/"+" = a list; the reason)
REFUSED_FLAGS: dict[str, tuple[int | str | None, str]] = {
    "--use-beam-search": (0, "the benchmark streams every request (it times tokens as they arrive) and beam "
                             "search answers come whole; send use_beam_search requests to the server directly"),
    "--probe-request-rate": (None, "probe requests beside the workload are not implemented"),
    "--profile": (0, "kvserve has no /start_profile endpoint (profile with benchmarks/profile_decode.py)"),
    "--self-timed": (0, "trace replay (timed_trace) is not implemented"),
    "--no-self-timed": (0, "trace replay (timed_trace) is not implemented"),
    "--skip-tokenizer-init": (0, "the benchmark needs the tokenizer to build exact-length prompts"),
    "--plot-timeline": (0, "the HTML timeline is not implemented (kvserve bench sweep plots throughput "
                           "against latency)"),
    "--timeline-itl-thresholds": (None, "the HTML timeline is not implemented"),
    "--plot-dataset-stats": (0, "the dataset statistics figure is not implemented"),
    "--no-stream": (0, _HF),
    "--enable-multimodal-chat": (0, _MULTIMODAL),
    "--custom-ensure-client-side-data": (0, _MULTIMODAL),
    "--random-batch-size": (None, _POOLING),
    "--no-reranker": (0, _POOLING),
    "--random-mm-base-items-per-request": (None, _MULTIMODAL),
    "--random-mm-num-mm-items-range-ratio": (None, _MULTIMODAL),
    "--random-mm-limit-mm-per-prompt": (None, _MULTIMODAL),
    "--random-mm-bucket-config": (None, _MULTIMODAL),
    "--sonnet-input-len": (None, "the sonnet dataset is not implemented (deprecated in vLLM)"),
    "--sonnet-output-len": (None, "the sonnet dataset is not implemented (deprecated in vLLM)"),
    "--sonnet-prefix-len": (None, "the sonnet dataset is not implemented (deprecated in vLLM)"),
    "--hf-subset": (None, _HF),
    "--hf-split": (None, _HF),
    "--hf-name": (None, _HF),
    "--hf-output-len": (None, _HF),
    "--blazedit-min-distance": (None, _HF),
    "--blazedit-max-distance": (None, _HF),
    "--asr-max-audio-len-sec": (None, _MULTIMODAL),
    "--asr-min-audio-len-sec": (None, _MULTIMODAL),
    "--bfcl-categories": (None, _HF),
    "--speed-bench-dataset-subset": (None, "the SPEED-Bench dataset is not implemented"),
    "--speed-bench-output-len": (None, "the SPEED-Bench dataset is not implemented"),
    "--speed-bench-category": (None, "the SPEED-Bench dataset is not implemented"),
    "--timed-trace-chunk-hash-size": (None, "trace replay (timed_trace) is not implemented"),
    "--timed-trace-sec-multiplier": (None, "trace replay (timed_trace) is not implemented"),
    "--timed-trace-label-timestamp": (None, "trace replay (timed_trace) is not implemented"),
    "--timed-trace-label-input-length": (None, "trace replay (timed_trace) is not implemented"),
    "--timed-trace-label-output-length": (None, "trace replay (timed_trace) is not implemented"),
    "--timed-trace-label-hash-ids": (None, "trace replay (timed_trace) is not implemented"),
}

COMPLETIONS_BACKENDS = ("openai", "vllm")
CHAT_BACKENDS = ("openai-chat",)
REFUSED_BACKENDS: dict[str, str] = {
    "openai-audio": "kvserve serves no audio transcription API",
    **{name: _POOLING for name in ("openai-embeddings", "openai-embeddings-chat", "openai-embeddings-clip",
                                   "openai-embeddings-vlm2vec", "infinity-embeddings",
                                   "infinity-embeddings-clip", "vllm-pooling", "vllm-rerank")},
}
REFUSED_DATASETS: dict[str, str] = {
    "burstgpt": "the BurstGPT trace dataset is not implemented",
    "sonnet": "the sonnet dataset is not implemented (deprecated in vLLM)",
    "random-mm": _MULTIMODAL,
    "random-rerank": _POOLING,
    "hf": _HF,
    "custom_audio": _MULTIMODAL,
    "custom_image": _MULTIMODAL,
    "custom_mm": _MULTIMODAL,
    "speed_bench": "the SPEED-Bench dataset is not implemented",
    "timed_trace": "trace replay (timed_trace) is not implemented",
}
TOKENIZER_MODES = ("auto", "hf", "slow")


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def check_refused(args: argparse.Namespace) -> None:
    """Refuse any flag, backend, dataset or tokenizer mode of ``vllm bench serve`` that kvserve
    does not implement.

    Raises:
        InvalidRequestError: naming the first one found and why.
    """
    for flag, (_, reason) in REFUSED_FLAGS.items():
        if hasattr(args, _dest(flag)):
            raise InvalidRequestError(f"{flag} is not supported by kvserve bench: {reason}", _dest(flag))
    backend = getattr(args, "backend", None)
    if backend in REFUSED_BACKENDS:
        raise InvalidRequestError(f"--backend {backend} is not supported: {REFUSED_BACKENDS[backend]}", "backend")
    if args.dataset_name in REFUSED_DATASETS:
        raise InvalidRequestError(f"--dataset-name {args.dataset_name} is not supported: "
                                  f"{REFUSED_DATASETS[args.dataset_name]}", "dataset_name")
    mode = getattr(args, "tokenizer_mode", "auto")
    if mode not in TOKENIZER_MODES:
        raise InvalidRequestError(f"--tokenizer-mode {mode} is not supported (kvserve loads tokenizers with "
                                  f"transformers: {', '.join(TOKENIZER_MODES)})", "tokenizer_mode")
