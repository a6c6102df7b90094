"""Engine flags, named as vLLM names them, and their conversion into the frozen configs."""

from __future__ import annotations

import argparse
import dataclasses

from kvserve.config import (CacheConfig, EngineConfig, ModelConfig, ParallelConfig, QuantizationConfig,
                            SchedulerConfig)
from kvserve.engine.arg_types import (byte_size, device_name, dtype_name, fraction, generation_config_mode,
                                      human_readable_positive_int, int4_group_size, load_format,
                                      non_negative_int, positive_float, positive_int)
from kvserve.engine.feature_args import (add_lora_args, add_structured_output_args, lora_config_from_args,
                                         structured_outputs_config_from_args)
from kvserve.generation_config import default_sampling_values, parse_override
from kvserve.vllm_compat import REFUSED_FLAGS, add_refused_flags, check_refused_kwargs


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add the engine flags to ``parser``, in vLLM's groups (``ModelConfig``, ``CacheConfig``, ...),
    and register the vLLM engine flags kvserve refuses (``kvserve.vllm_compat``)."""
    groups = {title: parser.add_argument_group(title) for title in (
        "ModelConfig", "LoadConfig", "DeviceConfig", "ParallelConfig", "CacheConfig", "SchedulerConfig",
        "StructuredOutputsConfig", "LoRAConfig")}
    _add_model_args(groups["ModelConfig"])
    _add_load_args(groups["LoadConfig"])
    _add_device_args(groups["DeviceConfig"])
    groups["ParallelConfig"].add_argument(
        "--disable-custom-all-reduce", action="store_true",
        help="accepted for vLLM compatibility; changes nothing: -tp all-reduces through torch.distributed (gloo, NCCL)")
    groups["ParallelConfig"].add_argument(
        "--data-parallel-size", "-dp", type=positive_int, default=1, metavar="N",
        help="kvserve serve: N engine processes on this machine (each with its share of the cores, "
             "--cpu-threads divided by N) behind kvserve route's cache-aware routing, one port (docs/router.md)")
    groups["ParallelConfig"].add_argument(
        "--data-parallel-rank", "-dpn", type=non_negative_int, default=None, metavar="R",
        help="this server is data-parallel rank R of a fleet behind an external load balancer (vLLM's "
             "meaning): its KV events carry data_parallel_rank R and use the --kv-events-config ports + R")
    parser.add_argument("--speculative-config", default=None, metavar="JSON",
                        help="vLLM's speculative decoding JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                             "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' or '{\"method\": \"draft_model\", "
                             "\"model\": DIR, \"num_speculative_tokens\": 4}' (docs/speculative_decoding.md)")
    parser.add_argument("--kv-events-config", default=None, metavar="JSON",
                        help="vLLM's KV-cache events over ZMQ, e.g. '{\"enable_kv_cache_events\": true, "
                             "\"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\"}' "
                             "(keys: kvserve.kv_events.config)")
    _add_kv_transfer_args(parser)
    _add_parallel_args(groups["ParallelConfig"])
    _add_cache_args(groups["CacheConfig"])
    _add_scheduler_args(groups["SchedulerConfig"])
    add_structured_output_args(groups["StructuredOutputsConfig"])
    add_lora_args(groups["LoRAConfig"])
    add_refused_flags(groups, parser)


def _add_kv_transfer_args(parser) -> None:
    group = parser.add_argument_group("KVTransferConfig", "KV beyond the pool: a disk tier, disaggregated "
                                      "prefill/decode (docs/kv_tiers.md)")
    group.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                       help="vLLM's KV-connector JSON with kvserve's connectors, e.g. '{\"kv_connector\": "
                            "\"DiskConnector\", \"kv_role\": \"kv_both\", \"kv_connector_extra_config\": "
                            "{\"path\": \"/var/cache/kvserve\"}}' (keys: kvserve.kv_transfer.config)")
    group.add_argument("--kv-offload-dir", default=None, metavar="DIR",
                       help="a disk tier in DIR: full KV blocks are written there and loaded on a prefix-cache "
                            "miss instead of recomputed; kept across restarts")
    group.add_argument("--kv-offload-size", type=positive_float, default=None, metavar="GIB",
                       help="size bound of --kv-offload-dir in GiB (default 10; least recently used blocks go)")
    group.add_argument("--kv-offloading-size", type=positive_float, default=None, metavar="GIB",
                       help="vLLM's: a host-memory tier of GIB for KV blocks beyond the pool (before the disk "
                            "tier; on a GPU between the device pool and the disk)")
    group.add_argument("--kv-offloading-backend", default=None, metavar="native",
                       help="vLLM's: native (kvserve's own host tier; lmcache is not supported)")
    group.add_argument("--kv-role", choices=("producer", "consumer"), default=None,
                       help="disaggregated prefill/decode: producer = a prefill instance serving its blocks "
                            "over TCP, consumer = a decode instance fetching them (kvserve route --pd)")
    group.add_argument("--kv-ip", default=None, help="producer: the address consumers reach its block server at "
                                                     "(default 127.0.0.1; it binds there)")
    group.add_argument("--kv-port", type=positive_int, default=None,
                       help="producer: its block server's TCP port (default 14579)")
    group.add_argument("--kv-producers", nargs="+", default=None, metavar="HOST:PORT",
                       help="consumer: the producers' block servers it may fetch from (required; a request naming "
                            "another is refused)")


def _add_load_args(group) -> None:
    group.add_argument("--load-format", type=load_format, default="auto", metavar="{auto,safetensors,dummy}",
                       help="auto/safetensors: the folder's safetensors weights; dummy: random weights, only "
                            "config.json read (vLLM's: benchmarks of a model's shape without its files)")


def _add_model_args(model) -> None:
    model.add_argument("--model", default=None, dest="model_option", metavar="MODEL",
                       help="Hugging Face model folder (the same as the positional MODEL)")
    model.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                       help="names clients may send as `model` (default: the folder's name); the "
                            "first is the one responses report")
    model.add_argument("--tokenizer", default=None, help="tokenizer folder if not the model's")
    model.add_argument("--dtype", type=dtype_name, default="auto",
                       help="auto, float32 (float), bfloat16, float16 (half); auto = the checkpoint's "
                            "torch_dtype (on CPU: bfloat16 with AMX/AVX512-BF16, else float32)")
    model.add_argument("--seed", type=int, default=0, help="seed of requests without their own (default 0)")
    model.add_argument("--attention-backend", choices=["auto", "torch", "cpu_paged", "triton"], default="auto",
                       help="attention implementation: auto (the C++ paged kernel on CPU where it builds, the "
                            "Triton kernels on CUDA where triton imports, else torch), torch (the portable "
                            "reference), cpu_paged, triton")
    # --quantization/-q (vLLM's flag, accepted at None, int8, int4, gptq and awq) is in vllm_compat's table.
    model.add_argument("--quantization-group-size", type=int4_group_size, default=QuantizationConfig.group_size,
                       metavar="{32,64,128}",
                       help=f"inputs per scale of --quantization int4 (default {QuantizationConfig.group_size})")
    model.add_argument("--quantize-lm-head", action="store_true",
                       help="with --quantization int8/int4, quantize the LM head as well (a tied one too; the "
                            "embedding lookup keeps the float weights)")
    model.add_argument("--max-model-len", type=human_readable_positive_int, default=None,
                       help="context length in tokens (prompt + output), e.g. 4096, 4k (4,000) or 4K "
                            "(4,096); default: the model's")
    model.add_argument("--generation-config", type=generation_config_mode, default="auto",
                       help="sampling defaults for requests that omit them: auto = the model's "
                            "generation_config.json (default), vllm = none, or a folder holding the file")
    model.add_argument("--override-generation-config", default=None, metavar="JSON",
                       help="JSON object laid over those defaults, e.g. '{\"temperature\": 0.5}' "
                            "(temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens)")
    model.add_argument("--trust-remote-code", action="store_true",
                       help="accepted for vLLM compatibility; changes nothing: kvserve never runs "
                            "Python code shipped in a model folder (architectures are its own)")
    model.add_argument("--enforce-eager", action="store_true",
                       help="run the model's PyTorch modules layer by layer, not the decoder layers' C++ "
                            "loop (kvserve's counterpart of CUDA graphs on the CPU; the same results, "
                            "slower at small batches)")
    model.add_argument("--disable-cascade-attn", action="store_true",
                       help="accepted for vLLM compatibility; changes nothing: kvserve has no cascade attention")
    model.add_argument("--hf-overrides", default=None, metavar="JSON",
                       help="config.json fields to replace, as JSON, e.g. '{\"architectures\": "
                            "[\"Qwen3ForSequenceClassification\"], \"classifier_from_token\": [\"no\", \"yes\"], "
                            "\"is_original_qwen3_reranker\": true}' (docs/pooling.md)")


def _add_device_args(device) -> None:
    from kvserve.cpu_threads import cpu_threads_arg

    device.add_argument("--device", type=device_name, default="auto", help="cpu, cuda, cuda:N or auto (default)")
    device.add_argument("--cpu-threads", type=cpu_threads_arg, default="auto", metavar="N|auto",
                        help="threads for CPU kernels (vLLM CPU: VLLM_CPU_OMP_THREADS_BIND); auto = the "
                             "cores this process may use (affinity and cgroup quota), see the README")


def _add_parallel_args(parallel) -> None:
    parallel.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=1, metavar="N",
                          help="split every layer over N ranks (processes, also over --nnodes machines) with "
                               "torch.distributed: gloo on CPU, NCCL on CUDA (docs/tensor_parallelism.md)")
    parallel.add_argument("--nnodes", type=positive_int, default=1, metavar="M",
                          help="machines the tensor-parallel ranks span (N/M ranks each; default 1)")
    parallel.add_argument("--node-rank", type=non_negative_int, default=0, metavar="K",
                          help="this machine's index among --nnodes; node 0 serves the API, the others only "
                               "run their ranks")
    parallel.add_argument("--master-addr", default="127.0.0.1", metavar="HOST",
                          help="address of node 0's rendezvous store (default 127.0.0.1)")
    parallel.add_argument("--master-port", type=non_negative_int, default=0, metavar="PORT",
                          help="its port (default 0: a free port, one machine only)")
    parallel.add_argument("--dist-timeout", type=float, default=60.0, metavar="SECONDS",
                          help="seconds a collective may take before a rank is taken for dead (default 60)")
    parallel.add_argument("--pin-cpus", action=argparse.BooleanOptionalAction, default=True,
                          help="on CPU with -tp > 1, give each rank of a machine its own run of cores "
                               "and that many threads (default on)")
    parallel.add_argument("--enable-expert-parallel", "-ep", action=argparse.BooleanOptionalAction, default=False,
                          help="with -tp N, split a mixture of experts' experts whole over the N ranks "
                               "(default: each expert's width split, as a dense MLP's)")


def parallel_config_from_args(args: argparse.Namespace) -> ParallelConfig:
    """``-tp``, ``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port`` (torchrun's
    and SLURM scripts' ``MASTER_ADDR`` / ``MASTER_PORT`` fill the two left at their defaults),
    ``--dist-timeout``, ``--pin-cpus``, ``--enable-expert-parallel``.

    Raises:
        ConfigError: inconsistent values (``ParallelConfig``). (``-tp`` with ``-dp`` is refused by
            ``kvserve serve``, the one command that runs ``-dp``.)
    """
    import os

    size = getattr(args, "tensor_parallel_size", 1)
    addr = getattr(args, "master_addr", "127.0.0.1")
    port = getattr(args, "master_port", 0)
    env_port = os.environ.get("MASTER_PORT", "")
    return ParallelConfig(
        tensor_parallel_size=size, nnodes=getattr(args, "nnodes", 1), node_rank=getattr(args, "node_rank", 0),
        master_addr=os.environ.get("MASTER_ADDR", addr) if addr == "127.0.0.1" else addr,
        master_port=int(env_port) if port == 0 and env_port.isdigit() else port,
        dist_timeout=getattr(args, "dist_timeout", 60.0), pin_cpus=getattr(args, "pin_cpus", True),
        enable_expert_parallel=getattr(args, "enable_expert_parallel", False),
    )


def _add_cache_args(cache) -> None:
    cache.add_argument("--block-size", type=positive_int, default=16, help="tokens per KV block (default 16)")
    cache.add_argument("--kv-cache-memory-bytes", type=byte_size, default=None,
                       help="KV cache size (e.g. 2GiB, 2G, 2e9); default on CPU: 25%% of available RAM")
    cache.add_argument("--gpu-memory-utilization", type=fraction, default=0.9,
                       help="share of GPU memory the engine may use (default 0.9)")
    cache.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    cache.add_argument("--num-gpu-blocks-override", type=positive_int, default=None, dest="num_blocks_override",
                       help="exact number of KV blocks (overrides the memory budget)")


def _add_scheduler_args(sched) -> None:
    sched.add_argument("--max-num-batched-tokens", type=human_readable_positive_int, default=2048,
                       help="token budget of one engine step (default 2048)")
    sched.add_argument("--max-num-seqs", type=positive_int, default=256,
                       help="most requests running at once (default 256)")
    sched.add_argument("--max-num-waiting", type=non_negative_int, default=1024,
                       help="waiting-queue bound; beyond it requests are rejected (429)")
    sched.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    sched.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    sched.add_argument("--long-prefill-token-threshold", type=non_negative_int, default=0,
                       help="most prompt tokens one request may take in a step (0 = no limit)")


def model_from_args(args: argparse.Namespace) -> str | None:
    """The model named by the positional ``MODEL`` or ``--model`` (None = the built-in model).

    Raises:
        ValueError: both are given and differ.
    """
    positional, option = getattr(args, "model", None), getattr(args, "model_option", None)
    if positional is not None and option is not None and positional != option:
        raise ValueError(f"the model is given twice, as {positional!r} and --model {option!r}; give one")
    return positional if positional is not None else option


def served_model_names(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``--served-model-name`` as a tuple (a lone string is one name; empty names are refused).

    Raises:
        ValueError: an empty or blank name.
    """
    names = (value,) if isinstance(value, str) else tuple(value or ())
    if any(not name.strip() for name in names):
        raise ValueError("--served-model-name has an empty name; give non-empty names")
    return names


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


def _runner_and_convert(args: argparse.Namespace) -> dict[str, str]:
    """``--runner`` and ``--convert`` (the values ``kvserve.vllm_compat``'s table admits), with
    vLLM's older ``--task embed`` meaning ``--runner pooling``.

    Raises:
        ValueError: ``--task embed`` with ``--runner generate``.
    """
    runner = str(getattr(args, "runner", None) or "auto").lower()
    convert = str(getattr(args, "convert", None) or "auto").lower()
    if str(getattr(args, "task", None) or "auto").lower() == "embed":
        if runner == "generate":
            raise ValueError("--task embed (vLLM's older spelling of --runner pooling) contradicts --runner generate")
        runner = "pooling"
    return {"runner": runner, "convert": convert}


def _kv_cache_dtype(value) -> str:
    """``--kv-cache-dtype`` (admitted by ``kvserve.vllm_compat``'s table; ``fp8`` = ``fp8_e4m3``)."""
    name = "auto" if value is None or str(value) in ("", "None") else str(value).lower()
    return "fp8_e4m3" if name == "fp8" else name


def quantization_config_from_args(args: argparse.Namespace, model: str | None = None) -> QuantizationConfig:
    """``--quantization`` (``None``/``none`` or absent: float weights; the table in
    ``kvserve.vllm_compat`` admits only None, int8, int4, gptq and awq), ``--quantization-group-size``,
    ``--quantize-lm-head``; with ``model``, reconciled with the folder's config.json (a GPTQ/AWQ
    checkpoint's method is detected, as vLLM does: ``kvserve.checkpoint_quantization``).

    Raises:
        ValueError: ``--quantize-lm-head`` without ``--quantization``; a ``--quantization`` that
            contradicts the checkpoint, or a quantization_config kvserve does not load.
    """
    method = getattr(args, "quantization", None)
    method = None if method is None or str(method).lower() in ("none", "") else str(method).lower()
    requested = QuantizationConfig(method=method, group_size=args.quantization_group_size,
                                   lm_head=args.quantize_lm_head)
    if model is not None:
        from kvserve.checkpoint_quantization import resolve_quantization

        requested = resolve_quantization(model, requested)
    if requested.lm_head and requested.method is None:
        raise ValueError("--quantize-lm-head needs --quantization int8 or int4")
    return requested


def _with_gguf_types(model: str, quantization: QuantizationConfig) -> QuantizationConfig:
    """``quantization`` with the GGML types of ``model`` when it is a GGUF file
    (``kvserve.model.gguf_file``).

    Raises:
        ValueError: ``--quantization`` with a GGUF file (its weights load as stored).
        CheckpointError: the GGUF file cannot be read.
    """
    from kvserve.model.gguf_file import find_gguf, open_gguf

    gguf = find_gguf(model)
    if gguf is None:
        return quantization
    if quantization.method is not None:
        raise ValueError(f"--quantization {quantization.method} does not apply to the GGUF file {gguf.name}: its "
                         "weights load as stored (Q8_0/Q6_K as int8, Q4_0/Q4_K as int4, F16/BF16/F32 as the dtype)")
    return dataclasses.replace(quantization, gguf_types=open_gguf(gguf).weight_types())


def engine_config_from_args(model: str, args: argparse.Namespace) -> EngineConfig:
    """Build the frozen :class:`EngineConfig` from parsed flags (``max_model_len`` is resolved
    against the checkpoint later, when the model is loaded); the sampling defaults are read from
    the model folder here (``kvserve.generation_config``).

    Raises:
        GenerationConfigError: bad ``--generation-config`` / ``--override-generation-config``.
        ValueError: ``--hf-overrides`` that is not a JSON object.
    """
    from kvserve.model.hf_overrides import parse_hf_overrides

    names = served_model_names(getattr(args, "served_model_name", None))
    override = args.override_generation_config
    override = override if isinstance(override, dict) else parse_override(override)
    model_config = ModelConfig(
        model=model, dtype=_default_dtype(model, args.dtype), max_model_len=args.max_model_len, device=args.device,
        seed=args.seed, served_model_name=names[0] if names else None, tokenizer=args.tokenizer,
        attention_backend=args.attention_backend,
        sampling_defaults=default_sampling_values(model, args.generation_config, override),
        quantization=_with_gguf_types(model, quantization_config_from_args(args, model)),
        enforce_eager=args.enforce_eager, **_runner_and_convert(args),
        hf_overrides=parse_hf_overrides(getattr(args, "hf_overrides", None)),
        load_format=getattr(args, "load_format", "auto"),
    )
    if getattr(args, "data_parallel_size", 1) > 1:
        raise ValueError(f"--data-parallel-size {args.data_parallel_size}: data parallelism runs several engine "
                         "processes behind one port, which only kvserve serve does")
    from kvserve.kv_events.config import kv_events_config_from_json

    kv_events = kv_events_config_from_json(getattr(args, "kv_events_config", None))
    cache_config = CacheConfig(
        block_size=args.block_size, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=args.enable_prefix_caching, num_blocks_override=args.num_blocks_override,
        enable_kv_cache_events=kv_events is not None and kv_events.publishes,
        kv_cache_dtype=_kv_cache_dtype(getattr(args, "kv_cache_dtype", None)),
    )
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len or 0, max_num_waiting=args.max_num_waiting,
        policy=args.scheduling_policy, enable_chunked_prefill=args.enable_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
    )
    from kvserve.kv_transfer.config import kv_transfer_config_from_flags, kv_transfer_config_from_json
    from kvserve.spec_decode.config import speculative_config_from_json

    kv_transfer = kv_transfer_config_from_flags(
        kv_transfer_config_from_json(getattr(args, "kv_transfer_config", None)), getattr(args, "kv_offload_dir", None),
        getattr(args, "kv_offload_size", None), getattr(args, "kv_role", None), getattr(args, "kv_port", None),
        getattr(args, "kv_ip", None), getattr(args, "kv_producers", None), getattr(args, "kv_offloading_size", None),
        getattr(args, "kv_offloading_backend", None))
    return EngineConfig(model=model_config, cache=cache_config, scheduler=scheduler_config,
                        structured_outputs=structured_outputs_config_from_args(args),
                        speculative=speculative_config_from_json(getattr(args, "speculative_config", None)),
                        lora=lora_config_from_args(args), parallel=parallel_config_from_args(args),
                        kv_transfer=kv_transfer)


def engine_config_from_kwargs(model: str, **kwargs) -> EngineConfig:
    """The offline ``LLM(model, **kwargs)`` path: the same names as the flags, with underscores
    (``max_model_len=512``, ``enable_prefix_caching=False``, ``generation_config="vllm"``,
    ``override_generation_config={"temperature": 0.5}``, ...). ``cpu_threads`` sets this
    process's thread count at once (``kvserve.cpu_threads``).

    Raises:
        TypeError: an unknown keyword (the message lists the accepted ones).
        ValueError: a vLLM keyword kvserve refuses (``quantization="fp8"``, ...), with why.
    """
    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser)
    args = parser.parse_args([])
    known = vars(args)
    refused = {flag.dest for flag in REFUSED_FLAGS}
    aliases = {"num_gpu_blocks_override": "num_blocks_override", "num_blocks": "num_blocks_override"}
    kwargs = {aliases.get(key, key): value for key, value in kwargs.items()}
    check_refused_kwargs(kwargs)
    if kwargs.get("reasoning_parser"):
        raise ValueError("reasoning_parser applies to the OpenAI server's chat completions (kvserve serve "
                         "--reasoning-parser NAME); the offline LLM returns the model's text whole")
    for key, value in kwargs.items():
        if key not in known and key not in refused:
            raise TypeError(f"unknown engine argument {key!r}; accepted: {', '.join(sorted(known))}")
        setattr(args, key, value)
    if "cpu_threads" in kwargs:
        from kvserve.cpu_threads import apply_cpu_threads

        apply_cpu_threads(kwargs["cpu_threads"])
    return engine_config_from_args(model, args)
