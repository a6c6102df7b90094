"""Load one tensor-parallel rank's shard of a Hugging Face checkpoint.

The module is built on the ``meta`` device with the rank's sizes (``TensorParallelShard
.local_arch``) and its row-parallel layers (``kvserve.distributed.layers.parallelize``), given
empty storage, and each parameter is filled from a memory-mapped slice of its safetensors tensor
(``safe_open(...).get_slice(name)[rows or columns]``): a rank reads and holds only its rows and
columns, never the whole model. Name mapping as ``kvserve.model.loader``, plus::

    ...o_proj.weight[:, rank's q columns]       -> ...o_proj.linear.weight     (row-parallel)
    ...down_proj.weight[:, rank's MLP columns]  -> ...mlp.down_proj.linear.weight
    ...mlp.experts.{e}.{gate,up}_proj[rank's expert rows] -> ...mlp.block.experts.{e}.gate_up_proj
    ...mlp.experts.{e}.down_proj[:, the same columns]     -> ...mlp.block.experts.{e}.down_proj
        (expert parallelism: the rank's experts whole, expert e as its local e - first; the
        other experts' tensors are not read; a shared expert split as a dense MLP)
    ...mlp.experts.{gate_up_proj,down_proj}[_bias|_blocks|_scales] (all experts in one tensor:
        GPT-OSS) -> cut into whole experts by the model's ``split_checkpoint_tensor``, then the
        rank's parts as above (``kvserve.distributed.expert_pieces``)
    ...self_attn.sinks[rank's q heads]          -> ...self_attn.sinks
    ...self_attn.{q_proj,q_b_proj,kv_b_proj}[rank's heads' rows] (latent attention, DeepSeek)
    model.embed_tokens.weight[rank's vocab rows] -> model.embed_tokens.weight (zero-padded rows)
    lm_head.weight[rank's vocab rows]           -> lm_head.weight

A GPTQ/AWQ checkpoint's packed tensors (``qweight``, ``qzeros``, ``scales``, ``g_idx``) are
sliced the same way, in whole packed words and whole groups (``kvserve.distributed.prequantized``),
and repacked into the rank's ``QuantizedLinear`` layers as ``kvserve.model.loader`` does. A
GGUF file is read by ``kvserve.model.gguf_loader`` in the rank's rows and columns (whole
quantization blocks).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from torch import nn

from kvserve.attention.backend import AttentionBackend
from kvserve.checkpoint_quantization import resolve_quantization
from kvserve.config import CheckpointQuantization, QuantizationConfig
from kvserve.distributed.communicator import Communicator
from kvserve.distributed.expert_pieces import rank_pieces
from kvserve.distributed.layers import RowParallelLinear, VocabParallelEmbedding, parallelize
from kvserve.distributed.prequantized import PackedSplit, read_packed_slice
from kvserve.distributed.shard import LATENT_COLUMN_PARALLEL, TensorParallelShard
from kvserve.errors import CheckpointError, ConfigError
from kvserve.kernels import kernels_for
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.gguf_file import find_gguf
from kvserve.model.kernel_layer import bind_kernels
from kvserve.model.layers import MergedLinear
from kvserve.model.loader import (LoadedModel, _is_ignorable, _renamed, _safetensors_files, _tensor_names,
                                  check_all_loaded, finished_facts)
from kvserve.model.meta_init import materialize
from kvserve.model.prequantized import (PACKED_TENSORS, drop_float_weights, install_quantized_linears,
                                        plan_mxfp4_linears, plan_quantized_linears)
from kvserve.model.quant_linear import quantize_linears
from kvserve.model.quant_summary import describe_weights
from kvserve.model.registry import get_model_class
from kvserve.startup_checks import check_architecture


class _SliceTarget(NamedTuple):
    """Checkpoint tensor ``[index]`` goes to ``param[row_start:row_end]``."""

    param: nn.Parameter
    row_start: int
    row_end: int
    index: tuple[slice, ...]


def load_shard(model_dir: str | Path, dtype: torch.dtype, device: torch.device, backend: AttentionBackend,
               shard_rank: int, communicator: Communicator,
               quantization: QuantizationConfig = QuantizationConfig(), expert_parallel: bool = False) -> LoadedModel:
    """Rank ``shard_rank``'s shard (of ``communicator.world_size``) of ``model_dir``. A GPTQ/AWQ
    checkpoint's packed tensors are read in the rank's slices (``kvserve.distributed
    .prequantized``). With ``quantization`` (``--quantization int8|int4``) the rank quantizes its own slices after loading
    (``kvserve.model.quant_linear.quantize_linears``). int4 groups never straddle two ranks
    (a rank's columns start at a multiple of the group size, else ``ConfigError``), so the
    quantized weights are those of one process; int8's per-output-channel scale of a row-parallel
    layer (o_proj, down_proj) is the maximum over the rank's columns only.

    Returns:
        a ``LoadedModel`` whose ``arch`` is the whole model's and whose ``num_kv_heads`` is the
        rank's (the KV heads its cache holds); ``model`` holds only the rank's slices.

    Raises:
        CheckpointError: as ``kvserve.model.loader.load_model`` (missing, unexpected or
            misshapen tensors).
        ConfigError: the model does not split over the ranks (``check_tensor_parallel``), or a
            pre-quantized checkpoint's groups or packed words do not (named).
    """
    model_dir = Path(model_dir)
    gguf = find_gguf(model_dir)
    if gguf is not None:
        return _load_gguf_shard(gguf, dtype, device, backend, shard_rank, communicator, quantization)
    check_architecture(model_dir)
    arch = ModelArchConfig.from_file(model_dir / "config.json")
    quantization = resolve_quantization(model_dir, quantization)
    spec = quantization.checkpoint
    files = _safetensors_files(model_dir)
    shard = TensorParallelShard(shard_rank, communicator.world_size, arch, expert_parallel)
    model_cls = get_model_class(arch.architecture)
    with torch.device("meta"):
        model = model_cls(shard.local_arch(), backend)
        parallelize(model, shard, communicator)
    plan = _quantized_plan(model, _tensor_names(files), spec, shard)
    splits = {} if spec is None or spec.method == "mxfp4" else _packed_splits(model, plan, shard)
    packed = _Packed({s: {} for shards in plan.values() for s in shards}, splits, spec)
    drop_float_weights(model, plan)
    model = materialize(model.to(dtype=dtype), device)
    bind_kernels(model, device, triton=backend.name == "triton")
    if arch.tie_word_embeddings and "lm_head" not in plan:
        model.lm_head.weight = model.model.embed_tokens.weight
    _load_slices(model, files, shard, packed, model_cls)
    if spec is not None:
        install_quantized_linears(model, plan, packed.tensors, spec, kernels_for(device), device)
    elif quantization.method is not None:
        try:
            quantize_linears(model, quantization.method, quantization.group_size, quantization.lm_head)
        except ValueError as exc:
            raise ConfigError(f"--quantization {quantization.method} with --tensor-parallel-size "
                              f"{communicator.world_size}: {exc}") from None
    model.eval()
    generation_config, weight_format = finished_facts(model, model_dir, dtype, spec)
    return LoadedModel(model, arch, dtype, generation_config, str(model_dir), weight_format, quantization,
                       num_kv_heads=shard.num_kv_heads, shard=shard)


def _load_gguf_shard(path: Path, dtype: torch.dtype, device: torch.device, backend: AttentionBackend,
                     shard_rank: int, communicator: Communicator, quantization: QuantizationConfig) -> LoadedModel:
    """A GGUF file's shard (``kvserve.model.gguf_loader.load_gguf_model`` with the rank's
    ``TensorParallelShard``: its rows and columns read from the memory map)."""
    from kvserve.model.gguf_file import open_gguf
    from kvserve.model.gguf_loader import load_gguf_model

    if quantization.method is not None:
        raise ConfigError(f"--quantization {quantization.method} does not apply to the GGUF file {path.name}: its "
                          "weights load as stored")
    gguf = open_gguf(path)
    shard = TensorParallelShard(shard_rank, communicator.world_size, gguf.arch)
    model = load_gguf_model(gguf, dtype, device, backend, shard, communicator)
    weight_format = f"GGUF {gguf.weight_types()}: {describe_weights(model, dtype)}"
    return LoadedModel(model, gguf.arch, dtype, {}, str(path), weight_format,
                       dataclasses.replace(quantization, gguf_types=gguf.weight_types()),
                       num_kv_heads=shard.num_kv_heads, shard=shard)


class _Packed(NamedTuple):
    """The packed GPTQ/AWQ tensors a rank collects while loading: ``tensors[checkpoint module]
    [part]`` (filled by ``_load_slices``), how each module splits, and the checkpoint's format."""

    tensors: dict[str, dict[str, torch.Tensor]]
    splits: dict[str, PackedSplit]
    spec: CheckpointQuantization | None


def _quantized_plan(model: nn.Module, names: list[str], spec: CheckpointQuantization | None,
                    shard: TensorParallelShard) -> dict[str, list[str]]:
    """The rank's linears a pre-quantized checkpoint fills (``plan_quantized_linears``' form): an
    MXFP4 expert linear from its expert's tensors in the whole model (``_checkpoint_module``)."""
    if spec is None:
        return {}
    if spec.method == "mxfp4":
        stored = [name.replace(".mlp.experts.", ".mlp.block.experts.") for name in names]
        return {name: [_checkpoint_module(name, shard)] for name in plan_mxfp4_linears(model, stored)}
    return plan_quantized_linears(model, names, spec, _row_parallel_names(model))


def _row_parallel_names(model: nn.Module) -> dict[str, str]:
    """``<layer>.linear`` -> ``<layer>`` for each row-parallel layer: the checkpoint's name of its
    inner linear."""
    return {f"{name}.linear": name for name, module in model.named_modules() if isinstance(module, RowParallelLinear)}


def _packed_splits(model: nn.Module, plan: dict[str, list[str]], shard: TensorParallelShard) -> dict[str, PackedSplit]:
    """Checkpoint module -> how the rank slices its packed tensors
    (``kvserve.distributed.prequantized``).

    Raises:
        ConfigError: a quantized LM head whose vocabulary does not split evenly over the ranks.
    """
    splits = {}
    for name, shards in plan.items():
        module = model.get_submodule(name)
        if isinstance(module, MergedLinear):
            for checkpoint_name in shards:
                rows = shard.rows_of(checkpoint_name.rpartition(".")[2])
                splits[checkpoint_name] = PackedSplit("column", *rows)
        elif name == "lm_head":
            start, end = shard.vocab_rows
            if end - start != module.out_features:
                raise ConfigError(f"a checkpoint with a quantized LM head and --tensor-parallel-size {shard.size}: "
                                  f"its vocabulary ({shard.arch.vocab_size}) does not split evenly over the ranks")
            splits[name] = PackedSplit("column", start, end)
        elif shards[0] != name:  # the inner linear of a RowParallelLinear
            start, end = shard.rows_of(shards[0].rpartition(".")[2])
            splits[shards[0]] = PackedSplit("row", start, end)
        else:
            splits[shards[0]] = PackedSplit("whole")
    return splits


_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")


def _checkpoint_module(module_name: str, shard: TensorParallelShard) -> str:
    """The checkpoint's name of a rank's module: the MoE block without its ``ParallelMoeBlock``
    wrapper, a held expert by its index in the whole model."""
    name = module_name.replace(".mlp.block.", ".mlp.")
    held = shard.held_experts
    if held is not None:
        name = _LOCAL_EXPERT.sub(lambda m: f".mlp.experts.{int(m.group(1)) + held[0]}.", f"{name}.")[:-1]
    return name


def _is_other_ranks_expert(name: str, shard: TensorParallelShard) -> bool:
    """A checkpoint tensor of an expert another rank holds (expert parallelism)."""
    held, match = shard.held_experts, _LOCAL_EXPERT.search(name)
    return held is not None and match is not None and not held[0] <= int(match.group(1)) < held[1]


def _slice_targets(model: nn.Module, shard: TensorParallelShard) -> dict[str, _SliceTarget]:
    """Checkpoint tensor name -> where and which slice, for every parameter of the rank's model."""
    targets: dict[str, _SliceTarget] = {}
    everything = (slice(None),)
    for name, param in model.named_parameters():  # a tied lm_head appears once, as embed_tokens
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        parent_name = module_name.rpartition(".")[0]
        parent = model.get_submodule(parent_name) if parent_name else model
        stored_parent = _checkpoint_module(parent_name, shard)
        if isinstance(module, MergedLinear):
            start = 0
            for shard_name, size in zip(module.shard_names, module.output_sizes, strict=True):
                rows = slice(*shard.rows_of(shard_name, stored_parent))
                targets[f"{stored_parent}.{shard_name}.{attr}"] = _SliceTarget(param, start, start + size, (rows,))
                start += size
        elif module_name.endswith("down_proj") and ".mlp.block." in module_name:  # an expert's, a shared expert's
            columns = slice(*shard.rows_of("down_proj", stored_parent))
            targets[f"{stored_parent}.down_proj.{attr}"] = _SliceTarget(param, 0, param.shape[0],
                                                                        (slice(None), columns))
        elif isinstance(parent, RowParallelLinear) and module is parent.linear:
            columns = slice(*shard.rows_of(parent_name.rpartition(".")[2]))
            targets[f"{parent_name}.{attr}"] = _SliceTarget(param, 0, param.shape[0], (slice(None), columns))
        elif shard.arch.mla is not None and module_name.rpartition(".")[2] in LATENT_COLUMN_PARALLEL:
            heads = slice(*shard.rows_of(module_name.rpartition(".")[2]))
            targets[name] = _SliceTarget(param, 0, param.shape[0], (heads,))
        elif attr == "sinks":
            heads = slice(*shard.rows_of("sinks"))
            targets[name] = _SliceTarget(param, 0, param.shape[0], (heads,))
        elif isinstance(module, VocabParallelEmbedding) or name == "lm_head.weight":
            start, end = shard.vocab_rows
            targets[name] = _SliceTarget(param, 0, end - start, (slice(start, end),))
        else:
            targets[f"{_checkpoint_module(module_name, shard)}.{attr}"] = _SliceTarget(param, 0, param.shape[0],
                                                                                       everything)
    return targets


@torch.no_grad()
def _load_slices(model: nn.Module, files: list[Path], shard: TensorParallelShard, packed: _Packed,
                 model_cls) -> None:
    """Copy the rank's slice of each checkpoint tensor (its name as the model class renames it,
    ``checkpoint_renames``; those it ignores, ``checkpoint_ignored``, unread) into its parameter;
    the packed tensors of pre-quantized linears go (sliced) into ``packed.tensors`` instead. A
    tensor the class splits (``split_checkpoint_tensor``: a layer's experts stored in one tensor,
    GPT-OSS) goes in the rank's parts of its pieces (``kvserve.distributed.expert_pieces``)."""
    targets = _slice_targets(model, shard)
    for target in targets.values():
        if target.row_end - target.row_start < target.param.shape[0]:
            target.param.data.zero_()  # the padding rows of the last vocabulary shard
    loaded: set[str] = set()
    tied = shard.arch.tie_word_embeddings
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for stored in f.keys():
                if stored.startswith(model_cls.checkpoint_ignored):
                    continue
                name = _renamed(stored, model_cls.checkpoint_renames)
                pieces = model_cls.split_checkpoint_tensor(name, lambda: f.get_tensor(stored))
                if pieces is not None:
                    for piece, whole in pieces:
                        for part_name, part in rank_pieces(piece, whole, shard):
                            _load_piece(part_name, part, targets, packed, f"{stored} ({piece})", path.name, shard)
                            loaded.add(part_name)
                    continue
                target = targets.get(name)
                if target is None and _is_other_ranks_expert(name, shard):
                    continue
                if target is None:
                    module, _, part = name.rpartition(".")
                    if module in packed.tensors and part in PACKED_TENSORS:
                        packed.tensors[module][part] = read_packed_slice(f.get_slice(stored), module, part,
                                                                         packed.splits[module], packed.spec,
                                                                         shard.size)
                        continue
                    if module in packed.tensors and part == "bias" and not f.get_tensor(stored).any():
                        continue  # a zero bias some GPTQ writers store for bias-free layers (as load_model)
                    if _is_ignorable(name, tied):
                        continue
                    raise CheckpointError(f"unexpected tensor {stored!r} in {path.name}; this model has no such weight")
                _copy_slice(target, f.get_slice(stored), stored, path.name, shard)
                loaded.add(name)
    check_all_loaded(targets, loaded)


def _load_piece(name: str, tensor: torch.Tensor, targets: dict[str, _SliceTarget], packed: _Packed, stored: str,
                file: str, shard: TensorParallelShard) -> None:
    """One of the rank's expert tensors cut from a fused checkpoint tensor ``stored``: into its
    parameter (the target's slice), or into ``packed.tensors`` (MXFP4 blocks and scales)."""
    module, _, kind = name.rpartition(".")
    if module in packed.tensors and kind in PACKED_TENSORS:
        packed.tensors[module][kind] = tensor.contiguous()
        return
    target = targets.get(name)
    if target is None:
        raise CheckpointError(f"tensor {stored!r} in {file} holds {name!r}; this model has no such weight")
    _copy_slice(target, tensor, stored, file, shard)


def _copy_slice(target: _SliceTarget, source, stored: str, file: str, shard: TensorParallelShard) -> None:
    """``source[target.index]`` (a tensor or a safetensors slice) into the target's rows."""
    tensor = source[target.index]
    dest = target.param.data[target.row_start : target.row_end]
    if tuple(tensor.shape) != tuple(dest.shape):
        raise CheckpointError(f"tensor {stored!r} in {file}: its slice {target.index} for tensor-parallel rank "
                              f"{shard.rank} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(tensor)


def shard_dtype(model_dir: str | Path, dtype: str, device: torch.device) -> torch.dtype:
    """The dtype every rank loads: the engine's rule for ``auto``
    (``kvserve.model.loader.default_dtype_for_device``), else the named one."""
    from kvserve.model.loader import default_dtype_for_device, load_arch_config, resolve_dtype

    if dtype == "auto":
        return default_dtype_for_device(model_dir, device)
    return resolve_dtype(dtype, load_arch_config(model_dir))
