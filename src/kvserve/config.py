"""Engine configuration: a few frozen dataclasses, one per concern, built once at start-up.

Flag names follow vLLM's (``--max-model-len``, ``--block-size``, ``--max-num-seqs``, ...), so a
vLLM user's command line carries over. Nothing mutates a config after start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvserve.errors import ConfigError
from kvserve.generation_config import SamplingDefaults
from kvserve.kv_transfer.config import KVTransferConfig
from kvserve.structured_output.config import StructuredOutputsConfig

DType = Literal["auto", "float32", "bfloat16", "float16"]


INT4_GROUP_SIZES = (32, 64, 128)
# Methods of pre-quantized checkpoints kvserve loads (config.json ``quantization_config.quant_method``).
CHECKPOINT_METHODS = ("gptq", "awq", "mxfp4")


@dataclass(frozen=True)
class CheckpointQuantization:
    """A pre-quantized checkpoint's ``quantization_config`` (parsed and checked by
    ``kvserve.checkpoint_quantization``; the tensors are read by ``kvserve.model.prequantized``).

    Attributes:
        method: ``gptq``, ``awq`` or ``mxfp4`` (GPT-OSS experts).
        bits: 4 (GPTQ also 8, symmetric).
        group_size: inputs per scale; -1 = one group over all inputs (per output channel).
        desc_act: GPTQ act-order (``g_idx`` gives each input's group); False for AWQ.
        sym: the quantizer's choice (informational: kvserve reads the stored zero points).
        checkpoint_format: ``gptq`` (v1: qzeros hold zero - 1), ``gptq_v2`` (qzeros hold the
            zero) or ``gemm`` (AWQ's GEMM layout).
        lm_head: the checkpoint declares its LM head quantized (GPTQModel's ``lm_head``).
    """

    method: str
    bits: int = 4
    group_size: int = 128
    desc_act: bool = False
    sym: bool = True
    checkpoint_format: str = "gptq"
    lm_head: bool = False

    @property
    def label(self) -> str:
        """e.g. ``gptq-int4-g128``, ``gptq-int4-g128-act_order``, ``awq-int4-g128``,
        ``gptq-int4-channel`` (group_size -1)."""
        if self.method == "mxfp4":
            return "mxfp4"
        group = "channel" if self.group_size == -1 else f"g{self.group_size}"
        return f"{self.method}-int{self.bits}-{group}" + ("-act_order" if self.desc_act else "")

    @property
    def layout(self) -> str:
        """The method and, where it differs, its packing, as the start-up line names the weights:
        ``gptq``, ``gptq (gptq_v2)``, ``awq (gemm)``, ``mxfp4``."""
        same = self.method == self.checkpoint_format
        return self.method if same else f"{self.method} ({self.checkpoint_format})"


@dataclass(frozen=True)
class QuantizationConfig:
    """Weight quantization: made at load (``--quantization int8|int4``,
    ``--quantization-group-size``, ``--quantize-lm-head``; ``kvserve.model.quant_linear``) or
    read from a pre-quantized checkpoint (``--quantization gptq|awq`` or detected from its
    config.json, as vLLM does; ``checkpoint``).

    Attributes:
        method: ``None`` = the checkpoint's float weights; ``int8`` (per output channel,
            symmetric) or ``int4`` (group-wise) = quantized at load from them; ``gptq`` or
            ``awq`` = the checkpoint's own integers (``checkpoint``).
        group_size: inputs per int4 scale (32, 64 or 128; a checkpoint's own for gptq/awq).
        lm_head: the LM head is quantized as well (made at load: also a tied one, the embedding
            keeps its float weights for the lookup; gptq/awq: as the checkpoint declares).
        checkpoint: the pre-quantized checkpoint's parsed ``quantization_config`` (gptq/awq).
        gguf_types: for a GGUF model, the GGML types of its matrices (``Q4_K+Q6_K``, ``F16``;
            ``GGUFFile.weight_types``), read from the file, not a flag; None otherwise.
    """

    method: str | None = None
    group_size: int = 32
    lm_head: bool = False
    checkpoint: CheckpointQuantization | None = None
    gguf_types: str | None = None

    @property
    def label(self) -> str | None:
        """Short label for ``/v1/models``, ``/version`` and bench provenance: None (float
        weights), ``int8``, ``int4-g32``, a checkpoint's ``CheckpointQuantization.label``, with
        ``+lm_head`` when the LM head is quantized too; ``gguf-Q4_0`` (``gguf-`` and the GGML types)
        for a GGUF model."""
        if self.gguf_types is not None:
            return f"gguf-{self.gguf_types}"
        if self.method is None:
            return None
        if self.checkpoint is not None:
            label = self.checkpoint.label
        else:
            label = self.method if self.method == "int8" else f"{self.method}-g{self.group_size}"
        return label + ("+lm_head" if self.lm_head else "")


@dataclass(frozen=True)
class ModelConfig:
    """What to load and how.

    Attributes:
        model: path to a Hugging Face model folder (config.json, *.safetensors, tokenizer files).
        dtype: ``auto`` takes the checkpoint's ``torch_dtype`` (on CPU: bfloat16 where the CPU
            has AMX/AVX512-BF16, else float32); or one of float32, bfloat16, float16.
        max_model_len: context length in tokens (prompt + output); ``None`` = the checkpoint's
            ``max_position_embeddings``.
        device: ``cpu``, ``cuda`` or ``auto`` (cuda when available).
        seed: seed of the engine-wide random generator (requests without a ``seed``).
        served_model_name: the name clients use in ``model``; defaults to the folder name.
        tokenizer: tokenizer folder, when it differs from ``model``.
        attention_backend: ``auto`` (the C++ paged kernel on CPU where it builds, else the
            portable torch backend), ``torch`` or ``cpu_paged`` (``--attention-backend``).
        sampling_defaults: sampling values for requests that omit them, from the model's
            generation_config.json and ``--generation-config`` / ``--override-generation-config``
            (``kvserve.generation_config``); empty = the API's own defaults.
        quantization: weight quantization (``QuantizationConfig``).
        enforce_eager: run the model's PyTorch modules layer by layer (``--enforce-eager``), not
            the decoder layers' C++ loop (``kvserve.model.fused_decoder``; the same bits).
        runner: ``auto``, ``generate`` or ``pooling`` (vLLM's ``--runner``; ``--task embed`` is
            ``pooling``): resolved against the folder by ``kvserve.pooling.config``.
        convert: ``auto``, ``none``, ``embed`` or ``classify`` (vLLM's ``--convert``: ``embed``
            adapts a decoder into an embedding model, last-token pooling; ``classify`` into a
            sequence classifier, ``kvserve.model.seq_cls``).
        hf_overrides: config.json fields replaced when the folder is read (vLLM's
            ``--hf-overrides``, ``kvserve.model.hf_overrides``); empty = none.
    """

    model: str
    dtype: DType = "auto"
    max_model_len: int | None = None
    device: str = "auto"
    seed: int = 0
    served_model_name: str | None = None
    tokenizer: str | None = None
    attention_backend: str = "auto"
    sampling_defaults: SamplingDefaults = SamplingDefaults()
    quantization: QuantizationConfig = QuantizationConfig()
    enforce_eager: bool = False
    runner: str = "auto"
    convert: str = "auto"
    hf_overrides: Mapping[str, Any] = field(default_factory=dict)
    load_format: str = "auto"  # "dummy": random weights, only config.json read (vLLM's)


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache.

    Attributes:
        block_size: tokens per KV block.
        kv_cache_memory_bytes: bytes of KV cache; ``None`` = on CPU a share
            (``cpu_kv_cache_fraction``) of the RAM available at start-up, on CUDA
            ``gpu_memory_utilization`` of device memory minus weights and activations.
        gpu_memory_utilization: share (0-1] of GPU memory the engine may use.
        enable_prefix_caching: reuse full KV blocks across requests by a chained block hash.
        num_blocks_override: exact number of blocks (tests; overrides the byte budget).
        enable_kv_cache_events: the KV manager records what enters and leaves the prefix cache
            (``--kv-events-config``); each step's events come back in ``StepResult.kv_events``.
        kv_cache_dtype: ``auto`` (the model's dtype), ``int8``, ``fp8_e4m3`` or ``fp8_e5m2``: each
            token's K/V row per KV head as one-byte values and a float32 scale
            (``--kv-cache-dtype``, ``kvserve.attention.kv_quant``).
    """

    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    num_blocks_override: int | None = None
    cpu_kv_cache_fraction: float = 0.25
    enable_kv_cache_events: bool = False
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching.

    Attributes:
        max_num_batched_tokens: token budget of one engine step (prefill chunks + decodes).
        max_num_seqs: most requests running at once.
        max_model_len: context length in tokens (filled from the model when not given).
        max_num_waiting: most requests queued; beyond it new requests are rejected.
        policy: ``fcfs`` or ``priority`` (lower ``priority`` value runs first, as in vLLM).
        enable_chunked_prefill: split long prompts over several steps.
        long_prefill_token_threshold: most prompt tokens one request may take in a step
            (0 = no limit besides the budget).
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 4096
    max_num_waiting: int = 1024
    policy: Literal["fcfs", "priority"] = "fcfs"
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's ``--speculative-config``; parsed and checked by
    ``kvserve.spec_decode.config.speculative_config_from_json``).

    Attributes:
        method: ``ngram`` (prompt lookup in the request's own tokens) or ``draft_model`` (a
            smaller model with the same tokenizer).
        num_speculative_tokens: most draft tokens proposed per request and step (``k``).
        prompt_lookup_max, prompt_lookup_min: n-gram lengths tried, longest first (ngram only).
        model: the draft model's folder (draft_model only).
        disable_by_batch_size: no request speculates while more than this many requests run
            (kvserve's batch-level switch; 0 = never disabled by batch size).
        min_acceptance_rate: a request whose recent drafts were accepted less often than this
            (accepted / drafted tokens) stops proposing for a while (kvserve's per-request
            switch; 0 = never).
    """

    method: Literal["ngram", "draft_model"]
    num_speculative_tokens: int
    prompt_lookup_max: int = 0
    prompt_lookup_min: int = 0
    model: str | None = None
    disable_by_batch_size: int = 0
    min_acceptance_rate: float = 0.0


@dataclass(frozen=True)
class LoRAConfig:
    """Multi-LoRA serving (vLLM's ``--enable-lora`` and its ``LoRAConfig`` flags).

    Attributes:
        max_loras: most distinct adapters in one batch (``--max-loras``; the runner's
            preallocated weight slots).
        max_lora_rank: largest adapter rank accepted (``--max-lora-rank``); every slot is this
            wide, so it also sets the work per adapter.
        max_cpu_loras: adapters kept loaded in CPU memory (``--max-cpu-loras``; least recently
            used ones are dropped and read again from disk when asked for); None = ``max_loras``.
        lora_dtype: ``auto`` (the model's dtype), ``float32``, ``bfloat16`` or ``float16``
            (``--lora-dtype``).
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    lora_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ConfigError(f"--max-loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ConfigError(f"--max-lora-rank must be >= 1, got {self.max_lora_rank}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"--max-cpu-loras ({self.max_cpu_loras}) must be >= --max-loras ({self.max_loras})")
        if self.lora_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"--lora-dtype must be auto, float32, bfloat16 or float16, got {self.lora_dtype!r}")

    @property
    def cpu_cache_size(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism across processes and machines (vLLM's ``-tp``, ``--nnodes``,
    ``--node-rank``, ``--master-addr``, ``--master-port``; ``kvserve.distributed``).

    Attributes:
        tensor_parallel_size: ranks that each hold a shard of every layer (1 = one process).
        nnodes: machines the ranks are spread over (``tensor_parallel_size / nnodes`` each).
        node_rank: this machine's index; node 0 runs the API server and rank 0 (the driver),
            the others only worker ranks.
        master_addr: address of node 0's rendezvous store (``127.0.0.1`` on one machine).
        master_port: its port; 0 = a free port (one machine only).
        dist_timeout: seconds any collective (and a worker's wait for the next step) may take
            before the rank gives up (``--dist-timeout``).
        pin_cpus: on the CPU, give each rank of a node its own share of this process's cores
            (``os.sched_setaffinity``) and as many threads (``kvserve.distributed.cpu_pinning``).
        enable_expert_parallel: a mixture of experts' experts split whole over the ranks
            (``--enable-expert-parallel``) instead of each expert's width
            (``kvserve.distributed.shard``).
    """

    tensor_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    dist_timeout: float = 60.0
    pin_cpus: bool = True
    enable_expert_parallel: bool = False

    def __post_init__(self) -> None:
        size, nnodes = self.tensor_parallel_size, self.nnodes
        if size < 1:
            raise ConfigError(f"--tensor-parallel-size must be >= 1, got {size}")
        if nnodes < 1 or size % nnodes:
            raise ConfigError(f"--nnodes {nnodes} must divide --tensor-parallel-size {size}")
        if not 0 <= self.node_rank < nnodes:
            raise ConfigError(f"--node-rank must be in [0, {nnodes - 1}] with --nnodes {nnodes}, got {self.node_rank}")
        if nnodes > 1 and self.master_port == 0:
            raise ConfigError("--master-port is required with --nnodes > 1 (every node must reach node 0's store)")
        if self.dist_timeout <= 0:
            raise ConfigError(f"--dist-timeout must be > 0 seconds, got {self.dist_timeout}")

    @property
    def ranks_per_node(self) -> int:
        return self.tensor_parallel_size // self.nnodes


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine core needs, passed down explicitly. ``lora`` is None unless
    ``--enable-lora``; ``kv_transfer`` unless ``--kv-transfer-config`` (or ``--kv-offload-dir``,
    ``--kv-role``)."""

    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    speculative: SpeculativeConfig | None = None
    lora: LoRAConfig | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer: KVTransferConfig | None = None

    def __post_init__(self) -> None:
        if self.model.load_format == "dummy" and self.parallel.tensor_parallel_size > 1:
            raise ConfigError("--load-format dummy runs one process: -tp > 1 loads each rank's shard from the files")
        if self.kv_transfer is None:
            return
        if not self.cache.enable_prefix_caching:
            raise ConfigError("--kv-transfer-config (and --kv-offload-dir, --kv-role) finds blocks by their "
                              "prefix-cache hashes: it needs prefix caching (drop --no-enable-prefix-caching)")
        if self.parallel.tensor_parallel_size > 1:
            raise ConfigError("--kv-transfer-config (and --kv-offload-dir, --kv-role) runs with one process: "
                              "-tp > 1 is not supported with it")
