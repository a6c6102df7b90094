"""Which part of each weight a tensor-parallel rank holds (Megatron-LM's split; Shoeybi et al.
2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism").

For ``N`` ranks and rank ``r``::

    q heads        [r*H/N, (r+1)*H/N)                       column-parallel (qkv_proj rows; a
                                                            sink logit per head, GPT-OSS)
    latent heads   the same heads' q_proj / q_b_proj and    DeepSeek: the compressed latent,
                   kv_b_proj rows, o_proj columns           its projection and norm whole (the
                                                            cache replicated on every rank)
    kv heads       [r*Hkv/N, (r+1)*Hkv/N)    when Hkv >= N
                   {r // (N/Hkv)} (one, replicated)  when Hkv < N (N a multiple of Hkv)
    gate, up rows  [r*I/N, (r+1)*I/N)                       column-parallel (gate_up_proj rows)
    o_proj, down   the same ranges as input columns         row-parallel: partial sums, one
                                                            all-reduce each
    experts        each expert's gate/up rows and down columns split as a dense MLP's (by the
                   expert width), or, with expert parallelism (``--enable-expert-parallel``),
                   experts [r*E/N, (r+1)*E/N) whole; a shared expert always split by its width;
                   the router whole. Either way a rank's MoE output is a partial sum: one
                   all-reduce per MoE layer (``kvserve.distributed.layers.ParallelMoeBlock``)
    vocabulary     [r*ceil(V/N), min((r+1)*ceil(V/N), V))   embedding rows (lookups outside the
                                                            range give 0, then all-reduce) and
                                                            LM head rows (logits gathered on
                                                            rank 0); the last shard is padded
    norms          whole on every rank

A query head keeps the KV head it reads in the full model: with ``g = H/Hkv`` query heads per
KV head, rank r's query heads ``[r*H/N, (r+1)*H/N)`` read KV heads ``[r*Hkv/N, ...)`` (split) or
head ``r*H/N // g = r // (N/Hkv)`` (replicated).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvserve.errors import ConfigError
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.quant_tensor import MXFP4_GROUP


def check_tensor_parallel(arch: ModelArchConfig, size: int, expert_parallel: bool = False) -> None:
    """Whether ``arch`` splits over ``size`` ranks (its experts whole per rank with
    ``expert_parallel``).

    Raises:
        ConfigError: one line naming ``--tensor-parallel-size`` and the field that does not split.
    """
    if size == 1:
        return
    flag = f"--tensor-parallel-size {size}"
    if arch.num_attention_heads % size:
        raise ConfigError(f"{flag}: num_attention_heads ({arch.num_attention_heads}) is not a multiple of {size}")
    kv = arch.num_key_value_heads
    if arch.mla is None and kv % size and size % kv:
        raise ConfigError(f"{flag}: num_key_value_heads ({kv}) is neither a multiple nor a divisor of {size}")
    moe = arch.moe
    dense_layers = moe is None or len(moe.sparse_layers) < arch.num_hidden_layers
    if dense_layers and arch.intermediate_size % size:
        raise ConfigError(f"{flag}: intermediate_size ({arch.intermediate_size}) is not a multiple of {size}")
    if moe is None:
        return
    if expert_parallel and moe.num_experts % size:
        raise ConfigError(f"{flag} --enable-expert-parallel: the experts ({moe.num_experts}) are not a multiple of "
                          f"{size}")
    if not expert_parallel and moe.intermediate_size % size:
        raise ConfigError(f"{flag}: the experts' width ({moe.intermediate_size}) is not a multiple of {size}")
    if moe.shared_expert_intermediate_size % size:
        raise ConfigError(f"{flag}: shared_expert_intermediate_size ({moe.shared_expert_intermediate_size}) is not a "
                          f"multiple of {size}")


# Latent attention's per-head rows (DeepSeek): q_proj / q_b_proj rows and kv_b_proj rows per
# head, o_proj input columns per head. The compressed projections (q_a_proj, kv_a_proj_with_mqa)
# and their norms are whole on every rank, and so is the cache (one latent row per token).
_MLA_HEAD_ROWS = {"q_proj": lambda m: m.qk_nope_head_dim + m.qk_rope_head_dim,
                  "q_b_proj": lambda m: m.qk_nope_head_dim + m.qk_rope_head_dim,
                  "kv_b_proj": lambda m: m.qk_nope_head_dim + m.v_head_dim,
                  "o_proj": lambda m: m.v_head_dim}
# Its column-parallel projections (o_proj is row-parallel).
LATENT_COLUMN_PARALLEL = tuple(name for name in _MLA_HEAD_ROWS if name != "o_proj")


@dataclass(frozen=True)
class TensorParallelShard:
    """Rank ``rank`` of ``size``'s share of a model (see the module docstring); row ranges are
    ``(start, end)`` in the full checkpoint tensor."""

    rank: int
    size: int
    arch: ModelArchConfig
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        check_tensor_parallel(self.arch, self.size, self.expert_parallel)
        if not 0 <= self.rank < self.size:
            raise ConfigError(f"tensor-parallel rank {self.rank} is outside [0, {self.size})")

    @property
    def num_heads(self) -> int:
        return self.arch.num_attention_heads // self.size

    @property
    def num_kv_heads(self) -> int:
        """KV heads this rank computes and caches (1, replicated, when there are fewer than ranks)."""
        return max(1, self.arch.num_key_value_heads // self.size)

    @property
    def first_kv_head(self) -> int:
        kv = self.arch.num_key_value_heads
        if kv >= self.size:
            return self.rank * self.num_kv_heads
        return self.rank // (self.size // kv)

    @property
    def intermediate_size(self) -> int:
        return self.arch.intermediate_size // self.size

    @property
    def vocab_per_rank(self) -> int:
        """Rows of each rank's embedding / LM head shard (the last one padded with zero rows)."""
        return -(-self.arch.vocab_size // self.size)

    @property
    def vocab_rows(self) -> tuple[int, int]:
        """The vocabulary ids this rank holds (fewer than ``vocab_per_rank`` on the last rank
        when ``size`` does not divide the vocabulary)."""
        start = min(self.rank * self.vocab_per_rank, self.arch.vocab_size)
        return start, min(start + self.vocab_per_rank, self.arch.vocab_size)

    @property
    def held_experts(self) -> tuple[int, int] | None:
        """The experts this rank holds whole under expert parallelism, else None (all, split)."""
        if self.arch.moe is None or not self.expert_parallel:
            return None
        share = self.arch.moe.num_experts // self.size
        return self.rank * share, (self.rank + 1) * share

    def rows_of(self, shard_name: str, module: str = "") -> tuple[int, int]:
        """Rows of checkpoint projection ``shard_name`` (q/k/v/gate/up_proj, latent attention's
        q_b_proj/kv_b_proj; ``sinks``: the rank's query heads) this rank holds; for o_proj and
        down_proj the same ranges index input columns. ``module``: the projection's parent
        (``...mlp.experts.3``, ``...mlp.shared_expert``), whose width splits an expert's rows (all
        of them under expert parallelism)."""
        moe = self.arch.moe
        if moe is not None and ".mlp." in f"{module}." and shard_name in ("gate_proj", "up_proj", "down_proj"):
            if ".shared_expert" in module:
                width = moe.shared_expert_intermediate_size
            elif ".experts." in module:
                if self.expert_parallel:
                    return 0, moe.intermediate_size
                width = moe.intermediate_size
            else:
                width = self.arch.intermediate_size
            part = width // self.size
            return self.rank * part, (self.rank + 1) * part
        if shard_name == "sinks":
            return self.rank * self.num_heads, (self.rank + 1) * self.num_heads
        head_dim = self.arch.head_dim
        if self.arch.mla is not None and shard_name in _MLA_HEAD_ROWS:
            head_dim = _MLA_HEAD_ROWS[shard_name](self.arch.mla)
        if shard_name in ("q_proj", "o_proj") or shard_name in _MLA_HEAD_ROWS:
            start = self.rank * self.num_heads * head_dim
            return start, start + self.num_heads * head_dim
        if shard_name in ("k_proj", "v_proj"):
            start = self.first_kv_head * head_dim
            return start, start + self.num_kv_heads * head_dim
        if shard_name in ("gate_proj", "up_proj", "down_proj"):
            start = self.rank * self.intermediate_size
            return start, start + self.intermediate_size
        raise KeyError(f"{shard_name!r} is not a split projection")

    def local_arch(self) -> ModelArchConfig:
        """The architecture of this rank's modules: its heads, MLP width and vocabulary rows
        (``head_dim`` and everything else unchanged)."""
        moe = self.arch.moe
        if moe is not None:
            moe = dataclasses.replace(
                moe, intermediate_size=moe.intermediate_size // (1 if self.expert_parallel else self.size),
                shared_expert_intermediate_size=moe.shared_expert_intermediate_size // self.size,
                held_experts=self.held_experts)
        return dataclasses.replace(
            self.arch, num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            intermediate_size=self.intermediate_size, vocab_size=self.vocab_per_rank, moe=moe,
        )


def check_parallel_options(config) -> None:
    """The engine options that do not combine with ``-tp > 1``, refused by name: ``--hf-overrides``, a GPTQ/AWQ
    checkpoint whose groups do not split over the ranks, MXFP4 experts whose width does not
    (a GGUF file's blocks are checked as the ranks load it).

    Args:
        config: the ``kvserve.config.EngineConfig``.

    Raises:
        ConfigError: one line naming the option.
    """
    size = config.parallel.tensor_parallel_size
    if size == 1:
        return
    if config.model.hf_overrides:
        raise ConfigError(f"--tensor-parallel-size {size} with --hf-overrides is not supported: the ranks read "
                          "config.json as it is; serve it without -tp")
    from kvserve.model.loader import load_arch_config

    model_arch = load_arch_config(config.model.model)
    stored = config.model.quantization.checkpoint
    if model_arch.moe is not None and stored is not None and stored.method != "mxfp4":
        raise ConfigError(f"--tensor-parallel-size {size}: a {stored.label} mixture-of-experts checkpoint runs on "
                          "one rank so far; serve it without -tp")
    from kvserve.model.registry import get_model_class

    if get_model_class(model_arch.architecture).attention_options(model_arch).qk_norm == "full":
        raise ConfigError(f"--tensor-parallel-size {size}: {model_arch.architecture}'s q/k norms over all heads at once "
                          "span the ranks and run on one rank so far; serve it without -tp")
    if stored is not None and stored.method == "mxfp4":
        check_mxfp4_split(model_arch, size, config.parallel.enable_expert_parallel)
    elif stored is not None:
        from pathlib import Path

        from kvserve.distributed.prequantized import check_prequantized_split

        arch = ModelArchConfig.from_file(Path(config.model.model) / "config.json")
        check_prequantized_split(arch, stored, size)


def check_mxfp4_split(arch: ModelArchConfig, size: int, expert_parallel: bool) -> None:
    """MXFP4 experts (GPT-OSS) split by their width only in whole groups of 32 inputs of the
    down projection; whole experts per rank always split.

    Raises:
        ConfigError: one line naming the flags, the width and the way out.
    """
    width = arch.moe.intermediate_size
    if not expert_parallel and (width // size) % MXFP4_GROUP:
        raise ConfigError(f"an mxfp4 checkpoint with --tensor-parallel-size {size}: each rank would take "
                          f"{width // size} of an expert's {width} inputs, not whole groups of {MXFP4_GROUP}; add "
                          "--enable-expert-parallel")
