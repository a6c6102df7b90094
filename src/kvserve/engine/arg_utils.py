"""Engine flags, named as vLLM names them, and their conversion into the frozen configs."""

from __future__ import annotations

import argparse

from kvserve.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig


def _parse_bytes(text: str) -> int:
    """``4GiB``, ``512MiB``, ``2e9`` or a plain integer -> bytes."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    lowered = text.strip().lower()
    for suffix, factor in units.items():
        if lowered.endswith(suffix):
            return int(float(lowered[: -len(suffix)]) * factor)
    return int(float(lowered))


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def device_name(text: str) -> str:
    if text not in ("auto", "cpu") and not text.startswith("cuda"):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add the engine flags (model, cache, scheduler) to ``parser``."""
    model = parser.add_argument_group("model")
    model.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="weights and activations dtype; auto = the checkpoint's torch_dtype "
                            "(bfloat16 on CPUs with AMX/AVX512-BF16, else float32, on CPU)")
    model.add_argument("--max-model-len", type=positive_int, default=None,
                       help="context length in tokens (prompt + output); default: the model's")
    model.add_argument("--device", type=device_name, default="auto", help="cpu, cuda, cuda:N or auto (default)")
    model.add_argument("--seed", type=int, default=0, help="seed of requests without their own (default 0)")
    model.add_argument("--tokenizer", default=None, help="tokenizer folder if not the model's")

    cache = parser.add_argument_group("KV cache")
    cache.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block (default 16)")
    cache.add_argument("--kv-cache-memory-bytes", type=_parse_bytes, default=None,
                       help="KV cache size (e.g. 2GiB); default on CPU: 25%% of available RAM")
    cache.add_argument("--gpu-memory-utilization", type=fraction, default=0.9,
                       help="share of GPU memory the engine may use (default 0.9)")
    cache.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    cache.add_argument("--num-gpu-blocks-override", type=positive_int, default=None, dest="num_blocks_override",
                       help="exact number of KV blocks (overrides the memory budget)")

    sched = parser.add_argument_group("scheduler")
    sched.add_argument("--max-num-batched-tokens", type=positive_int, default=2048,
                       help="token budget of one engine step (default 2048)")
    sched.add_argument("--max-num-seqs", type=positive_int, default=256,
                       help="most requests running at once (default 256)")
    sched.add_argument("--max-num-waiting", type=non_negative_int, default=1024,
                       help="waiting-queue bound; beyond it requests are rejected (429)")
    sched.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    sched.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    sched.add_argument("--long-prefill-token-threshold", type=non_negative_int, default=0,
                       help="most prompt tokens one request may take in a step (0 = no limit)")


def _default_dtype(model: str, dtype: str) -> str:
    """``auto`` for the built-in model means float32: it is tiny, so bfloat16 saves nothing and
    costs its text quality (it was trained in float32). Other models keep ``auto``."""
    if dtype != "auto":
        return dtype
    from pathlib import Path

    from kvserve.builtin import builtin_model_path
    from kvserve.errors import CheckpointError

    try:
        if Path(model).resolve() == builtin_model_path().resolve():
            return "float32"
    except CheckpointError:
        pass
    return dtype


def engine_config_from_args(model: str, args: argparse.Namespace) -> EngineConfig:
    """Build the frozen :class:`EngineConfig` from parsed flags (``max_model_len`` is resolved
    against the checkpoint later, when the model is loaded)."""
    model_config = ModelConfig(
        model=model, dtype=_default_dtype(model, args.dtype), max_model_len=args.max_model_len, device=args.device,
        seed=args.seed, served_model_name=getattr(args, "served_model_name", None), tokenizer=args.tokenizer,
    )
    cache_config = CacheConfig(
        block_size=args.block_size, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching, num_blocks_override=args.num_blocks_override,
    )
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len or 0, max_num_waiting=args.max_num_waiting,
        policy=args.scheduling_policy, enable_chunked_prefill=args.enable_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
    )
    return EngineConfig(model=model_config, cache=cache_config, scheduler=scheduler_config)


def engine_config_from_kwargs(model: str, **kwargs) -> EngineConfig:
    """The offline ``LLM(model, **kwargs)`` path: the same names as the flags, with underscores
    (``max_model_len=512``, ``enable_prefix_caching=False``, ``block_size=16``, ...).

    Raises:
        TypeError: an unknown keyword (the message lists the accepted ones).
    """
    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser)
    args = parser.parse_args([])
    known = vars(args)
    aliases = {"num_gpu_blocks_override": "num_blocks_override", "num_blocks": "num_blocks_override"}
    for key, value in kwargs.items():
        key = aliases.get(key, key)
        if key not in known:
            raise TypeError(f"unknown engine argument {key!r}; accepted: {', '.join(sorted(known))}")
        setattr(args, key, value)
    return engine_config_from_args(model, args)
