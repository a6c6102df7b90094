"""The ``vllm serve`` flags kvserve does not implement, each refused by name with the reason.

A vLLM command line carries over to ``kvserve serve``: every flag either means what it means in
vLLM or stops the start with one line naming it, e.g.::

    kvserve: error: argument --quantization/-q: 'fp8' is not supported: kvserve quantizes a float
    checkpoint at load (...) or loads 4-bit GPTQ and AWQ (GEMM) checkpoints (...); other methods
    (fp8, bitsandbytes, gguf, marlin repacks, ...) are not implemented (accepted: int8, int4, gptq, awq,
    mxfp4)

Some flags are accepted at the value that describes what kvserve does anyway (``-pp 1``,
``--kv-cache-dtype auto``, ``--no-fully-sharded-loras``) or at the values kvserve implements
(``--quantization int8``, ``--kv-cache-dtype int8|fp8``); any other value is refused. The table follows
vLLM's argument groups (``vllm serve --help``); the list as a table: ``docs/vllm_compat.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["value", "list", "bool"]


@dataclass(frozen=True)
class RefusedFlag:
    """One vLLM flag (with its aliases) kvserve refuses.

    Attributes:
        flags: the option strings, long name first (``("--quantization", "-q")``).
        group: vLLM's argument group (``ModelConfig``, ``Frontend``, ...).
        reason: why kvserve refuses it and what to do instead.
        kind: ``value`` (one argument), ``list`` (one or more) or ``bool`` (a switch; its
            ``--no-`` form, which asks for kvserve's behaviour, is accepted).
        allowed: values that describe kvserve's behaviour and are accepted (compared as text,
            integers by value); shown in ``--help`` when present.
    """

    flags: tuple[str, ...]
    group: str
    reason: str
    kind: Kind = "value"
    allowed: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flags[0].lstrip("-").replace("-", "_")

    def accepts(self, value: Any) -> bool:
        """True when ``value`` (a parsed string, list, bool or number) is one kvserve honours."""
        if value is None or self.kind == "bool":
            return not value
        if value in ("", "None"):  # vLLM's spelling of "unset" for optional values
            return True
        values = value if isinstance(value, (list, tuple)) else [value]
        return bool(values) and all(_normal(v) in {_normal(a) for a in self.allowed} for v in values)

    def message(self, value: Any) -> str:
        shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        head = "not supported" if self.kind == "bool" else f"{shown!r} is not supported"
        only = f" (accepted: {', '.join(self.allowed)})" if self.allowed else ""
        return f"{head}: {self.reason}{only}"


def _normal(value: Any) -> str:
    text = str(value).strip()
    try:
        return str(int(text))
    except ValueError:
        return text.lower()


_MM = "kvserve serves text-only models (no images, audio or video)"
_LORA_VOCAB = "LoRA adapters cannot add tokens (vLLM removed extra-vocabulary adapters too)"
_PAR = ("kvserve runs tensor parallelism (-tp, its experts split whole with --enable-expert-parallel) and one "
        "machine's data parallelism (-dp) only: no pipeline or context parallelism, no expert load balancing or "
        "all-to-all backends and no multi-node data parallelism yet")
_HUB = ("kvserve loads local model folders and downloads nothing; fetch the model first "
        "(`hf download REPO --revision REV --local-dir DIR`) and pass DIR")
_EAGER = "kvserve runs eagerly: it has no CUDA graphs and no torch.compile"
_LOOKAHEAD = "lookahead slots are sized by --speculative-config (the draft model's num_speculative_tokens)"
_QUANT = ("kvserve quantizes a float checkpoint at load (int8 per channel, int4 group-wise with "
          "--quantization-group-size) or loads 4-bit GPTQ and AWQ (GEMM) checkpoints, 8-bit symmetric GPTQ and "
          "GPT-OSS's MXFP4 experts (detected from config.json); other methods (fp8, bitsandbytes, gguf, marlin "
          "repacks, ...) are not implemented")
_DIST = "kvserve has no distributed or disaggregated serving yet"
_TOOL_PLUGIN = ("parser plugins are not supported; the built-in tool-call parsers are hermes, llama3_json, "
                "mistral, openai and pythonic (--tool-call-parser)")
_POOL = ("kvserve runs generative models, embedding models and sequence classifiers (--runner pooling, "
         "--convert embed|classify; docs/pooling.md); token-level pooling and plugins are not implemented")
_POOLER = ("pooling is read from the model folder (sentence-transformers modules.json, else the architecture's "
           "default: CLS for encoders, LAST for decoders); edit 1_Pooling/config.json instead")
_CFG = "edit the model folder's config.json instead"

REFUSED_FLAGS: tuple[RefusedFlag, ...] = (
    # ModelConfig
    RefusedFlag(("--runner",), "ModelConfig", _POOL, allowed=("auto", "generate", "pooling")),
    RefusedFlag(("--convert",), "ModelConfig", _POOL, allowed=("auto", "none", "embed", "classify")),
    RefusedFlag(("--task",), "ModelConfig", _POOL, allowed=("auto", "generate", "embed")),
    RefusedFlag(("--tokenizer-mode",), "ModelConfig",
                "kvserve loads the folder's Hugging Face tokenizer (tokenizer.json / tokenizer.model)",
                allowed=("auto", "hf")),
    RefusedFlag(("--hf-config-path",), "ModelConfig", "config.json is read from the model folder; " + _CFG),
    RefusedFlag(("--allowed-local-media-path",), "ModelConfig", _MM),
    RefusedFlag(("--allowed-media-domains",), "ModelConfig", _MM, kind="list"),
    RefusedFlag(("--revision",), "ModelConfig", "a local folder has no revisions; " + _HUB),
    RefusedFlag(("--code-revision",), "ModelConfig", "a local folder has no revisions; " + _HUB),
    RefusedFlag(("--tokenizer-revision",), "ModelConfig", "a local folder has no revisions; " + _HUB),
    RefusedFlag(("--rope-scaling",), "ModelConfig", _CFG),
    RefusedFlag(("--rope-theta",), "ModelConfig", _CFG),
    RefusedFlag(("--quantization", "-q"), "ModelConfig", _QUANT, allowed=("int8", "int4", "gptq", "awq", "mxfp4")),
    RefusedFlag(("--max-logprobs",), "ModelConfig", "kvserve returns at most 20 logprobs per token",
                allowed=("20",)),
    RefusedFlag(("--logprobs-mode",), "ModelConfig",
                "logprobs are those of the model's raw logits", allowed=("raw_logprobs",)),
    RefusedFlag(("--disable-sliding-window",), "ModelConfig",
                "sliding-window models always run with their window", kind="bool"),
    RefusedFlag(("--skip-tokenizer-init",), "ModelConfig", "kvserve needs the tokenizer", kind="bool"),
    RefusedFlag(("--enable-prompt-embeds",), "ModelConfig", "prompts are text or token ids", kind="bool"),
    RefusedFlag(("--config-format",), "ModelConfig", "config.json in Hugging Face format is read",
                allowed=("auto", "hf")),
    RefusedFlag(("--hf-token",), "ModelConfig", _HUB),
    RefusedFlag(("--pooler-config",), "ModelConfig", _POOLER),
    RefusedFlag(("--override-pooler-config",), "ModelConfig", _POOLER),
    RefusedFlag(("--logits-processor-pattern",), "ModelConfig", "custom logits processors are not supported"),
    RefusedFlag(("--logits-processors",), "ModelConfig", "custom logits processors are not supported", kind="list"),
    RefusedFlag(("--enable-sleep-mode",), "ModelConfig", "sleep mode is not implemented", kind="bool"),
    RefusedFlag(("--model-impl",), "ModelConfig", "kvserve runs its own model code", allowed=("auto", "vllm")),
    RefusedFlag(("--override-attention-dtype",), "ModelConfig", "attention runs in the model's dtype"),
    RefusedFlag(("--io-processor-plugin",), "ModelConfig", "plugins are not supported"),
    # LoadConfig
    RefusedFlag(("--download-dir",), "LoadConfig", _HUB),
    RefusedFlag(("--safetensors-load-strategy",), "LoadConfig",
                "weights are read through a memory map", allowed=("lazy",)),
    RefusedFlag(("--model-loader-extra-config",), "LoadConfig", "there is one loader, without options"),
    RefusedFlag(("--ignore-patterns",), "LoadConfig", "every safetensors file of the index is read", kind="list"),
    RefusedFlag(("--use-tqdm-on-load",), "LoadConfig", "kvserve shows no per-shard progress bar", kind="bool"),
    RefusedFlag(("--pt-load-map-location",), "LoadConfig", "kvserve reads no .pt files"),
    # StructuredOutputsConfig
    RefusedFlag(("--reasoning-parser-plugin",), "StructuredOutputsConfig",
                "parser plugins are not supported; the built-in reasoning parsers are deepseek_r1, qwen3 and "
                "openai_gptoss (--reasoning-parser)"),
    RefusedFlag(("--guided-decoding-disable-fallback",), "StructuredOutputsConfig",
                "backend fallback is chosen with --structured-outputs-config '{\"backend\": \"auto\"}'",
                kind="bool"),
    # ParallelConfig
    RefusedFlag(("--pipeline-parallel-size", "-pp"), "ParallelConfig", _PAR, allowed=("1",)),
    RefusedFlag(("--decode-context-parallel-size", "-dcp"), "ParallelConfig", _PAR, allowed=("1",)),
    RefusedFlag(("--distributed-executor-backend",), "ParallelConfig", _PAR),
    RefusedFlag(("--data-parallel-start-rank", "-dpr"), "ParallelConfig", _PAR),
    RefusedFlag(("--data-parallel-size-local", "-dpl"), "ParallelConfig", _PAR),
    RefusedFlag(("--data-parallel-address", "-dpa"), "ParallelConfig", _PAR),
    RefusedFlag(("--data-parallel-rpc-port", "-dpp"), "ParallelConfig", _PAR),
    RefusedFlag(("--data-parallel-backend", "-dpb"), "ParallelConfig", _PAR),
    RefusedFlag(("--data-parallel-hybrid-lb",), "ParallelConfig", _PAR, kind="bool"),
    RefusedFlag(("--data-parallel-external-lb",), "ParallelConfig", _PAR, kind="bool"),
    RefusedFlag(("--all2all-backend",), "ParallelConfig", _PAR),
    RefusedFlag(("--enable-dbo",), "ParallelConfig", _PAR, kind="bool"),
    RefusedFlag(("--dbo-decode-token-threshold",), "ParallelConfig", _PAR),
    RefusedFlag(("--dbo-prefill-token-threshold",), "ParallelConfig", _PAR),
    RefusedFlag(("--enable-eplb",), "ParallelConfig", _PAR, kind="bool"),
    RefusedFlag(("--eplb-config",), "ParallelConfig", _PAR),
    RefusedFlag(("--expert-placement-strategy",), "ParallelConfig", _PAR),
    RefusedFlag(("--max-parallel-loading-workers",), "ParallelConfig", "weights are loaded by one process"),
    RefusedFlag(("--ray-workers-use-nsight",), "ParallelConfig", _PAR, kind="bool"),
    RefusedFlag(("--worker-cls",), "ParallelConfig", "kvserve has no worker classes to swap"),
    RefusedFlag(("--worker-extension-cls",), "ParallelConfig", "kvserve has no worker classes to swap"),
    # CacheConfig
    RefusedFlag(("--kv-cache-dtype",), "CacheConfig",
                "one-byte KV caches store each K/V row with a float32 scale; other dtypes are not implemented",
                allowed=("auto", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")),
    RefusedFlag(("--swap-space",), "CacheConfig",
                "kvserve preempts by recomputation and keeps no CPU swap space"),
    RefusedFlag(("--cpu-offload-gb",), "CacheConfig", "weight offloading is not implemented", allowed=("0",)),
    RefusedFlag(("--prefix-caching-hash-algo",), "CacheConfig",
                "prefix-cache blocks are keyed by kvserve's own chained hash"),
    RefusedFlag(("--calculate-kv-scales",), "CacheConfig", "there is no fp8 KV cache to scale", kind="bool"),
    RefusedFlag(("--kv-sharing-fast-prefill",), "CacheConfig", "KV sharing across layers is not implemented", kind="bool"),
    RefusedFlag(("--mamba-cache-dtype",), "CacheConfig", "kvserve runs no Mamba models"),
    RefusedFlag(("--mamba-ssm-cache-dtype",), "CacheConfig", "kvserve runs no Mamba models"),
    RefusedFlag(("--mamba-block-size",), "CacheConfig", "kvserve runs no Mamba models"),
    # MultiModalConfig
    *(RefusedFlag((flag,), "MultiModalConfig", _MM, kind=kind) for flag, kind in (
        ("--limit-mm-per-prompt", "value"), ("--enable-mm-embeds", "bool"), ("--media-io-kwargs", "value"),
        ("--mm-processor-kwargs", "value"), ("--mm-processor-cache-gb", "value"),
        ("--disable-mm-preprocessor-cache", "bool"), ("--mm-processor-cache-type", "value"),
        ("--mm-shm-cache-max-object-size-mb", "value"), ("--mm-encoder-tp-mode", "value"),
        ("--mm-encoder-attn-backend", "value"), ("--interleave-mm-strings", "bool"),
        ("--skip-mm-profiling", "bool"), ("--video-pruning-rate", "value"))),
    # LoRAConfig
    RefusedFlag(("--lora-extra-vocab-size",), "LoRAConfig", _LORA_VOCAB, allowed=("0",)),
    RefusedFlag(("--fully-sharded-loras",), "LoRAConfig", _PAR, kind="bool"),
    RefusedFlag(("--default-mm-loras",), "LoRAConfig", _MM),
    # ObservabilityConfig
    RefusedFlag(("--show-hidden-metrics-for-version",), "ObservabilityConfig",
                "kvserve has no hidden (deprecated) metrics to show"),
    RefusedFlag(("--collect-detailed-traces",), "ObservabilityConfig",
                "traces carry request spans only (--otlp-traces-endpoint)"),
    # SchedulerConfig
    RefusedFlag(("--max-num-partial-prefills",), "SchedulerConfig",
                "one prompt is prefilled in chunks at a time", allowed=("1",)),
    RefusedFlag(("--max-long-partial-prefills",), "SchedulerConfig",
                "one prompt is prefilled in chunks at a time", allowed=("1",)),
    RefusedFlag(("--num-lookahead-slots",), "SchedulerConfig", _LOOKAHEAD, allowed=("0",)),
    RefusedFlag(("--disable-chunked-mm-input",), "SchedulerConfig", _MM, kind="bool"),
    RefusedFlag(("--scheduler-cls",), "SchedulerConfig", "kvserve has one scheduler"),
    RefusedFlag(("--disable-hybrid-kv-cache-manager",), "SchedulerConfig",
                "kvserve has one KV cache manager", kind="bool"),
    RefusedFlag(("--async-scheduling",), "SchedulerConfig", "scheduling runs in step with the model", kind="bool"),
    # CompilationConfig / VllmConfig
    RefusedFlag(("--cudagraph-capture-sizes",), "CompilationConfig", _EAGER, kind="list"),
    RefusedFlag(("--cuda-graph-sizes",), "CompilationConfig", _EAGER, kind="list"),
    RefusedFlag(("--max-cudagraph-capture-size",), "CompilationConfig", _EAGER),
    RefusedFlag(("--compilation-config", "-O"), "VllmConfig", _EAGER),
    RefusedFlag(("--additional-config",), "VllmConfig", "there are no platform plugins to configure"),
    RefusedFlag(("--aggregate-engine-logging",), "VllmConfig", _PAR, kind="bool"),
)

FRONTEND_REFUSED_FLAGS: tuple[RefusedFlag, ...] = (
    RefusedFlag(("--uds",), "Frontend", "kvserve listens on TCP only (--host, --port)"),
    RefusedFlag(("--disable-access-log-for-endpoints",), "Frontend",
                "use --disable-uvicorn-access-log to drop every access line"),
    RefusedFlag(("--chat-template-content-format",), "Frontend",
                "message content reaches the template as a string", allowed=("auto", "string")),
    RefusedFlag(("--trust-request-chat-template",), "Frontend",
                "requests cannot bring their own chat template", kind="bool"),
    RefusedFlag(("--return-tokens-as-token-ids",), "Frontend",
                "set return_tokens_as_token_ids per request instead", kind="bool"),
    RefusedFlag(("--tool-parser-plugin",), "Frontend", _TOOL_PLUGIN),
    RefusedFlag(("--tool-server",), "Frontend",
                "built-in tool servers (browser, code interpreter) are not supported: the client runs its tools"),
    RefusedFlag(("--log-config-file",), "Frontend", "use --log-level and --log-format"),
    RefusedFlag(("--max-log-len",), "Frontend", "request log lines carry no prompt text unless --log-prompts"),
    RefusedFlag(("--enable-prompt-tokens-details",), "Frontend",
                "usage reports prompt_tokens_details.cached_tokens already", kind="bool"),
    RefusedFlag(("--enable-force-include-usage",), "Frontend",
                "ask for usage per request (stream_options.include_usage)", kind="bool"),
    RefusedFlag(("--enable-tokenizer-info-endpoint",), "Frontend", "/tokenizer_info is not implemented", kind="bool"),
    RefusedFlag(("--enable-log-outputs",), "Frontend", "request log lines carry no output text", kind="bool"),
    RefusedFlag(("--log-error-stack",), "Frontend", "use --log-level debug", kind="bool"),
    RefusedFlag(("--middleware",), "Frontend", "custom ASGI middleware is not supported"),
    RefusedFlag(("--enable-ssl-refresh",), "Frontend", "restart the server to load new certificates", kind="bool"),
    RefusedFlag(("--enable-offline-docs",), "Frontend",
                "the /docs page loads its assets from a CDN; use /openapi.json offline", kind="bool"),
    RefusedFlag(("--headless",), "Frontend", _PAR, kind="bool"),
    RefusedFlag(("--api-server-count", "-asc"), "Frontend", "one API server process serves the engine",
                allowed=("1",)),
    RefusedFlag(("--config",), "Frontend", "give the flags on the command line (YAML config files are not read)"),
    RefusedFlag(("--grpc",), "Frontend", "kvserve serves HTTP only", kind="bool"),
    RefusedFlag(("--fingerprint-mode",), "Frontend", "system_fingerprint is not reported"),
)


class _RefuseAction(argparse.Action):
    """Stores an accepted value; raises ``ArgumentError`` (naming the flag) for any other."""

    def __init__(self, option_strings, dest, refused: RefusedFlag, negative: bool = False, **kwargs):
        self.refused = refused
        self.negative = negative
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        value = False if self.negative else (True if self.refused.kind == "bool" else values)
        if not self.refused.accepts(value):
            raise argparse.ArgumentError(self, self.refused.message(value))
        setattr(namespace, self.dest, value)


def add_refused_flags(groups: dict[str, Any], parser: argparse.ArgumentParser,
                      table: Sequence[RefusedFlag] = REFUSED_FLAGS) -> None:
    """Register ``table`` on ``parser``: flags with accepted values are shown in their vLLM group
    of ``groups`` (title -> argument group), the rest are hidden from ``--help``."""
    for refused in table:
        target = groups.get(refused.group, parser) if refused.allowed else parser
        shown = f"vLLM flag; {refused.reason}; accepted: {', '.join(refused.allowed)}"
        help_text = shown.replace("%", "%%") if refused.allowed else argparse.SUPPRESS
        nargs = {"value": None, "list": "+", "bool": 0}[refused.kind]
        target.add_argument(*refused.flags, action=_RefuseAction, refused=refused, dest=refused.dest,
                            nargs=nargs, default=argparse.SUPPRESS, help=help_text)
        if refused.kind == "bool":
            parser.add_argument("--no-" + refused.flags[0][2:], action=_RefuseAction, refused=refused,
                                negative=True, dest=refused.dest, nargs=0, default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS)


def check_refused_kwargs(kwargs: dict[str, Any], table: Sequence[RefusedFlag] = REFUSED_FLAGS) -> None:
    """The offline ``LLM(model, quantization="fp8")`` path: the same refusal as the flag.

    Raises:
        ValueError: a keyword names a refused flag with a value kvserve does not honour.
    """
    by_dest = {refused.dest: refused for refused in table}
    for key, value in kwargs.items():
        refused = by_dest.get(key)
        if refused is not None and not refused.accepts(value):
            raise ValueError(f"{key}={value!r}: {refused.message(value)}")
