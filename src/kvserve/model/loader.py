"""Load a Hugging Face checkpoint folder (or a GGUF file: ``kvserve.model.gguf_loader``) into one
of our models.

Memory: the module is built on the ``meta`` device (no storage, no random init), given empty
storage of the target dtype on the target device, then each safetensors tensor is read through a
memory map and copied (cast) straight into its slice of the pre-allocated parameter. Peak memory is
the weights plus one tensor in flight.

Name mapping (Hugging Face -> ours), done from ``MergedLinear.shard_names``::

    ...self_attn.{q,k,v}_proj.{weight,bias}  -> ...self_attn.qkv_proj rows [q | k | v]
    ...mlp.{gate,up}_proj.{weight,bias}      -> ...mlp.gate_up_proj rows [gate | up]
    everything else                          -> the same name

A GPTQ/AWQ checkpoint (config.json ``quantization_config``; ``kvserve.checkpoint_quantization``)
stores its quantized linears as ``<module>.{qweight,qzeros,scales,g_idx}``: those linears get no
float weight (only their biases are loaded as float), their packed tensors are collected by the
same pass and repacked into ``QuantizedLinear`` layers (``kvserve.model.prequantized``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from safetensors import safe_open
from torch import nn

from kvserve.attention import get_attention_backend
from kvserve.attention.backend import AttentionBackend
from kvserve.checkpoint_quantization import resolve_quantization
from kvserve.config import QuantizationConfig
from kvserve.errors import CheckpointError, ConfigError
from kvserve.kernels import kernels_for
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.gguf_file import find_gguf, open_gguf
from kvserve.model.kernel_layer import bind_kernels
from kvserve.model.layers import MergedLinear
from kvserve.model.meta_init import materialize
from kvserve.model.prequantized import (PACKED_TENSORS, drop_float_weights, install_quantized_linears,
                                        plan_mxfp4_linears, plan_quantized_linears)
from kvserve.model.quant_linear import quantize_linears
from kvserve.model.quant_summary import describe_weights
from kvserve.model.registry import get_model_class
from kvserve.startup_checks import check_architecture, missing_safetensors_message

if TYPE_CHECKING:
    from kvserve.pooling.config import PoolerConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run.

    Attributes:
        model: our ``nn.Module`` (e.g. ``LlamaForCausalLM``) in eval mode, weights loaded.
        arch: the parsed config.json.
        dtype: parameter dtype.
        generation_config: generation_config.json as a dict ({} when absent).
        model_dir: the folder it was loaded from.
        weight_format: what the linear weights are, e.g. ``bfloat16``, ``int4 (group 32,
            symmetric); LM head bfloat16`` (``kvserve.model.quant_summary``) or ``gptq
            (gptq_v2): int4 (group 128, zero points, act order); LM head bfloat16``.
        quantization: the quantization it runs (a checkpoint's gptq/awq resolved, as
            ``kvserve.checkpoint_quantization.resolve_quantization``).
        num_kv_heads: KV heads this process computes and caches: its share under tensor
            parallelism (``kvserve.distributed``); None = all of ``arch.num_key_value_heads``.
        shard: under tensor parallelism, the ``kvserve.distributed.shard.TensorParallelShard``
            ``model`` holds; None = the whole model.
    """

    model: nn.Module
    arch: ModelArchConfig
    dtype: torch.dtype
    generation_config: dict[str, Any] = field(default_factory=dict)
    model_dir: str = ""
    weight_format: str = ""
    quantization: QuantizationConfig = QuantizationConfig()
    num_kv_heads: int | None = None
    shard: Any = None

    @property
    def cached_kv_heads(self) -> int:
        """KV heads per layer in this process's KV cache."""
        return self.arch.num_key_value_heads if self.num_kv_heads is None else self.num_kv_heads


class _Target(NamedTuple):
    """Where one checkpoint tensor goes: ``param[row_start:row_end]``."""

    param: nn.Parameter
    row_start: int
    row_end: int


def resolve_dtype(dtype: str | torch.dtype, arch: ModelArchConfig, stored: torch.dtype | None = None) -> torch.dtype:
    """``auto`` -> the checkpoint's ``dtype``/``torch_dtype`` field, else ``stored`` (the dtype of
    its tensors), else float32; any other value must name float32, bfloat16 or float16.

    Raises:
        CheckpointError: the name (given or from the checkpoint) is not one of those three.
    """
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise CheckpointError(f"dtype {dtype} is not supported; use one of {', '.join(_DTYPES)}")
        return dtype
    if dtype == "auto" and arch.torch_dtype is None:
        return stored if stored in _DTYPES.values() else torch.float32
    name = str(arch.torch_dtype if dtype == "auto" else dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise CheckpointError(f"dtype {name!r} is not supported; use 'auto' or one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def cpu_supports_bf16() -> bool:
    """True when this CPU has native bfloat16 matmul: the ``amx_bf16`` or ``avx512_bf16`` flag in
    ``/proc/cpuinfo`` (False where that file cannot be read)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def default_dtype_for_device(model_dir: str | Path, device: str | torch.device, load_format: str = "auto") -> torch.dtype:
    """What ``--dtype auto`` means for the engine (vLLM's rule, adapted to CPUs):

    - CUDA: the checkpoint's dtype (``resolve_dtype(\"auto\")``).
    - CPU with AMX-BF16 or AVX512-BF16: bfloat16 whatever the checkpoint stores (float32 and
      float16 checkpoints are cast: bf16 matmuls run on AMX, ~5x the fp32 throughput here, and
      weights are half the bytes, which bound small-batch decode).
    - other CPUs: float32 for float32/float16 checkpoints, bfloat16 for bfloat16 ones.

    ``load_model(dtype="auto")`` itself keeps the checkpoint's dtype (library callers and numerics
    tests get what the checkpoint says); only the engine applies this rule.

    Raises:
        CheckpointError: config.json is missing or names an unsupported dtype.
    """
    model_dir = Path(model_dir)
    gguf = find_gguf(model_dir)
    if gguf is not None:
        opened = open_gguf(gguf)
        arch, stored = opened.arch, opened.stored_dtype()
    else:
        arch = ModelArchConfig.from_file(model_dir / "config.json")
        stored = None
        if arch.torch_dtype is None and load_format != "dummy":
            stored = _stored_dtype(_safetensors_files(model_dir))
    checkpoint = resolve_dtype("auto", arch, stored)
    if torch.device(device).type != "cpu":
        return checkpoint
    if checkpoint == torch.bfloat16 or cpu_supports_bf16():
        return torch.bfloat16
    return torch.float32


def load_arch_config(model: str | Path, hf_overrides: Mapping[str, Any] | None = None) -> ModelArchConfig:
    """The ``ModelArchConfig`` of a model folder (its config.json, ``hf_overrides`` laid over it)
    or GGUF file (its metadata).

    Raises:
        CheckpointError: as ``ModelArchConfig.from_file`` / ``GGUFFile.arch``.
    """
    gguf = find_gguf(model)
    if gguf is not None:
        return open_gguf(gguf).arch
    return ModelArchConfig.from_file(Path(model) / "config.json", hf_overrides)


def _stored_dtype(files: list[Path]) -> torch.dtype | None:
    """The dtype of the first tensor of the first file (for configs without a dtype field)."""
    with safe_open(str(files[0]), framework="pt") as f:
        name = next(iter(f.keys()), None)
        return None if name is None else _SAFETENSORS_DTYPES.get(f.get_slice(name).get_dtype())


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    attn_backend: AttentionBackend | None = None,
    quantization: QuantizationConfig = QuantizationConfig(),
    pooler: PoolerConfig | None = None,
    hf_overrides: Mapping[str, Any] | None = None,
    tokenizer_dir: str | Path | None = None,
    load_format: str = "auto",
) -> LoadedModel:
    """Read config.json (+ generation_config.json) and the safetensors weights of ``model_dir``.

    Args:
        model_dir: Hugging Face model folder, or a GGUF file (or a folder holding one and no
            config.json; ``kvserve.model.gguf_loader``).
        dtype: ``auto`` (the checkpoint's, see ``resolve_dtype``), ``float32``, ``bfloat16`` or
            ``float16``.
        device: where the parameters live.
        attn_backend: attention backend the model calls (default: ``get_attention_backend("torch")``).
        quantization: ``--quantization`` int8/int4: after loading, every linear (the LM head with
            ``lm_head``) is quantized from its float weight in ``dtype``
            (``kvserve.model.quant_linear.quantize_linears``). A GPTQ/AWQ checkpoint is read as
            such whatever this says (``gptq``/``awq`` or None; another method is refused).
        pooler: load for pooling (``--runner pooling``; its ``PoolerConfig``): the class built is
            ``pooler.architecture`` (a decoder's ``*ForSequenceClassification`` under ``--convert
            classify``); a decoder's LM head is neither built nor read (a checkpoint may lack it)
            unless a classifier makes its head from LM-head rows (``kvserve.model.seq_cls``, then
            the tokenizer of ``tokenizer_dir``, default ``model_dir``, names the rows); a head's
            modules (``head_modules``) stay float32; a decoder checkpoint saved without the
            ``model.`` prefix (a ``*Model`` one, as Qwen3-Embedding's) loads too, as vLLM's
            pooling adapters do. An encoder (``attn_type`` ``encoder_only``) caches no K/V
            (``LoadedModel.num_kv_heads`` 0).
        hf_overrides: ``--hf-overrides``, laid over config.json (``kvserve.model.hf_overrides``).
        load_format: ``dummy`` (vLLM's): no weight file is read; every parameter is drawn
            uniformly from [-1e-3, 1e-3] (``dummy_weights``), for benchmarks of a model's shape.

    Raises:
        CheckpointError: missing config.json, unknown architecture, a quantization_config kvserve
            does not load (named), no safetensors file, missing tensor, tensor of the wrong
            shape, or an unexpected tensor (rotary ``inv_freq`` buffers and a tied
            ``lm_head.weight`` are ignored).
        ConfigError: an int4 group size that does not divide a layer's inputs; a
            ``quantization`` that contradicts the checkpoint's; ``--quantization`` with a GGUF file.
    """
    model_dir = Path(model_dir)
    gguf = find_gguf(model_dir)
    if gguf is not None:
        if load_format == "dummy":
            raise ConfigError("--load-format dummy makes a Hugging Face folder's weights; a GGUF file holds its own")
        return _load_gguf(gguf, dtype, device, attn_backend, quantization)
    check_architecture(model_dir, hf_overrides)  # names an unsupported one before its config fields are parsed
    arch = ModelArchConfig.from_file(model_dir / "config.json", hf_overrides)
    quantization = resolve_quantization(model_dir, quantization)
    spec = quantization.checkpoint
    model_cls = get_model_class((pooler.architecture if pooler is not None else "") or arch.architecture)
    dummy = load_format == "dummy"
    files = [] if dummy else _safetensors_files(model_dir)
    torch_dtype = resolve_dtype(dtype, arch, _stored_dtype(files) if arch.torch_dtype is None else None)
    backend = attn_backend if attn_backend is not None else get_attention_backend("torch")
    with torch.device("meta"):
        model = model_cls(arch, backend)
    renames, ignored = model_cls.checkpoint_renames, model_cls.checkpoint_ignored
    if pooler is not None and not getattr(model, "reads_lm_head", False):
        if hasattr(model, "lm_head"):
            del model.lm_head  # pooling runs the hidden states (or a classifier's own head), never the LM head
        ignored += ("lm_head.",)
    stored_names = _tensor_names(files)
    prefix = "model." if pooler is not None and _lacks_model_prefix(model, stored_names, ignored) else ""
    names = [prefix + _renamed(n, renames) for n in stored_names if not n.startswith(ignored)]
    if spec is None:
        plan = {}
    else:
        plan = plan_mxfp4_linears(model, names) if spec.method == "mxfp4" else plan_quantized_linears(model, names, spec)
    drop_float_weights(model, plan)
    model = materialize(model.to(dtype=torch_dtype), device)
    for name in getattr(model, "head_modules", ()) if pooler is not None else ():
        if hasattr(model, name.split(".")[0]):  # a pooling head in float32, as vLLM's head_dtype
            model.get_submodule(name).to(torch.float32)
    bind_kernels(model, device, triton=backend.name == "triton")
    if arch.tie_word_embeddings and "lm_head" not in plan and hasattr(model, "lm_head"):
        # materialize gives each parameter its own storage; tie again.
        model.lm_head.weight = model.model.embed_tokens.weight
    packed = {shard: {} for shards in plan.values() for shard in shards}
    if dummy:
        dummy_weights(model)
    else:
        _load_weights(model, files, tied=arch.tie_word_embeddings, packed=packed, renames=renames,
                      ignored=ignored, split=model_cls.split_checkpoint_tensor, prefix=prefix)
    if spec is not None:
        install_quantized_linears(model, plan, packed, spec, kernels_for(device), device)
    elif quantization.method is not None:
        try:
            quantize_linears(model, quantization.method, quantization.group_size, quantization.lm_head)
        except ValueError as exc:
            raise ConfigError(f"--quantization {quantization.method}: {exc}") from None
    if getattr(model, "reads_lm_head", False):
        from kvserve.tokenizer import load_tokenizer

        model.load_head_from_lm_head(load_tokenizer(tokenizer_dir or model_dir))
    model.eval()
    generation_config, weight_format = finished_facts(model, model_dir, torch_dtype, spec)
    encoder = getattr(model_cls, "attn_type", "decoder") == "encoder_only"
    return LoadedModel(model, arch, torch_dtype, generation_config, str(model_dir), weight_format, quantization,
                       num_kv_heads=0 if encoder else None)


def dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Every parameter drawn uniformly from [-1e-3, 1e-3] (vLLM's dummy load format), seeded, on
    the parameter's device; norms' weights too (activations stay small, which is all a benchmark
    of the shape needs)."""
    for index, parameter in enumerate(model.parameters()):
        generator = torch.Generator(device=parameter.device).manual_seed(seed + index)
        with torch.no_grad():
            parameter.uniform_(-1e-3, 1e-3, generator=generator)


def finished_facts(model: nn.Module, model_dir: Path, dtype: torch.dtype, spec: Any) -> tuple[dict, str]:
    """A loaded checkpoint's ``generation_config.json`` (empty when absent) and its weights' format
    as the logs and ``/version`` say it (a prequantized ``spec``'s layout first)."""
    gen_path = model_dir / "generation_config.json"
    generation_config = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    weight_format = describe_weights(model, dtype)
    if spec is not None:
        weight_format = f"{spec.layout}: {weight_format}"
    return generation_config, weight_format


def _lacks_model_prefix(model: nn.Module, names: list[str], ignored: tuple[str, ...]) -> bool:
    """Whether a decoder's checkpoint names its tensors without the ``model.`` prefix (saved from
    transformers' ``*Model``: ``layers.0...``, ``embed_tokens.weight``)."""
    inner = getattr(model, "model", None)
    kept = [n for n in names if not n.startswith(ignored)]
    return inner is not None and bool(kept) and not any(n.startswith("model.") for n in kept)


def _load_gguf(path: Path, dtype, device, attn_backend, quantization: QuantizationConfig) -> LoadedModel:
    from kvserve.model.gguf_loader import load_gguf_model

    if quantization.method is not None:
        raise ConfigError(f"--quantization {quantization.method} does not apply to the GGUF file {path.name}: its "
                          "weights load as stored (Q8_0/Q6_K as int8, Q4_0/Q4_K as int4, F16/BF16/F32 as the dtype)")
    gguf = open_gguf(path)
    torch_dtype = resolve_dtype(dtype, gguf.arch, gguf.stored_dtype())
    backend = attn_backend if attn_backend is not None else get_attention_backend("torch")
    model = load_gguf_model(gguf, torch_dtype, device, backend)
    weight_format = f"GGUF {gguf.weight_types()}: {describe_weights(model, torch_dtype)}"
    return LoadedModel(model, gguf.arch, torch_dtype, {}, str(path), weight_format,
                       replace(quantization, gguf_types=gguf.weight_types()))


def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard files that do not exist: {', '.join(missing)}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(missing_safetensors_message(model_dir))


def _tensor_names(files: list[Path]) -> list[str]:
    names: list[str] = []
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            names.extend(f.keys())
    return names


def _merged_targets(model: nn.Module) -> dict[str, tuple[_Target, tuple[str, ...]]]:
    """A ``MergedLinear``'s own parameter name -> (its whole destination, its shards' names): the
    checkpoints that store the projection fused (Phi-3's ``qkv_proj``, ``gate_up_proj``)."""
    merged: dict[str, tuple[_Target, tuple[str, ...]]] = {}
    for name, param in model.named_parameters():
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        if isinstance(module, MergedLinear):
            parent = module_name.rpartition(".")[0]
            merged[name] = (_Target(param, 0, param.shape[0]),
                            tuple(f"{parent}.{shard}.{attr}" for shard in module.shard_names))
    return merged


def _weight_targets(model: nn.Module) -> dict[str, _Target]:
    """Checkpoint tensor name -> destination, for every parameter of ``model``."""
    targets: dict[str, _Target] = {}
    for name, param in model.named_parameters():  # a tied lm_head appears once, as embed_tokens
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        if isinstance(module, MergedLinear):
            parent = module_name.rpartition(".")[0]
            start = 0
            for shard, size in zip(module.shard_names, module.output_sizes, strict=True):
                targets[f"{parent}.{shard}.{attr}"] = _Target(param, start, start + size)
                start += size
        else:
            targets[name] = _Target(param, 0, param.shape[0])
    return targets


def _renamed(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    """A checkpoint tensor's name as this model's modules spell it (``checkpoint_renames`` of the
    model class: substrings replaced in order, e.g. Mixtral's ``.block_sparse_moe.`` -> ``.mlp.``)."""
    for old, new in renames:
        name = name.replace(old, new)
    return name


def _is_ignorable(name: str, tied: bool) -> bool:
    return name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight")


@torch.no_grad()
def _load_weights(model: nn.Module, files: list[Path], tied: bool,
                  packed: dict[str, dict[str, torch.Tensor]] | None = None,
                  renames: tuple[tuple[str, str], ...] = (), ignored: tuple[str, ...] = (),
                  split=None, prefix: str = "") -> None:
    """Copy each checkpoint tensor into its parameter (its name ``_renamed`` first); the packed
    tensors of the quantized checkpoint modules named in ``packed`` are collected there instead
    (and an all-zero bias of such a module without one is skipped); tensors whose stored name
    starts with one of ``ignored`` are not read. ``split(name, tensor)``: the model's
    ``split_checkpoint_tensor``, for tensors stored several to one (GPT-OSS's experts).
    ``prefix``: put before every stored name (a ``*Model`` checkpoint loaded into ``*ForCausalLM``)."""
    targets, merged = _weight_targets(model), _merged_targets(model)
    packed = {} if packed is None else packed
    loaded: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for stored in f.keys():
                if stored.startswith(ignored):
                    continue
                name = prefix + _renamed(stored, renames)
                pieces = None if split is None else split(name, lambda: f.get_tensor(stored))
                if pieces is not None:
                    for piece, tensor in pieces:
                        module, _, kind = piece.rpartition(".")
                        if module in packed and kind in PACKED_TENSORS:  # an MXFP4 expert's blocks / scales
                            packed[module][kind] = tensor
                            continue
                        target, names = (targets[piece], (piece,)) if piece in targets else merged.get(piece, (None, ()))
                        if target is None:
                            raise CheckpointError(f"tensor {stored!r} in {path.name} holds {piece!r}; this model has "
                                                  "no such weight")
                        _copy_into(target, tensor, f"{stored} ({piece})", path.name)
                        loaded.update(names)
                    continue
                target = targets.get(name)
                if target is None and name in merged:  # stored fused: fills every shard at once
                    target, shards = merged[name]
                    loaded.update(shards)
                if target is None:
                    module, _, kind = name.rpartition(".")
                    if module in packed and kind in PACKED_TENSORS:
                        packed[module][kind] = f.get_tensor(stored)
                        continue
                    if module in packed and kind == "bias" and not f.get_tensor(stored).any():
                        continue  # a zero bias some GPTQ writers store for bias-free layers (vLLM skips it too)
                    if _is_ignorable(name, tied):
                        continue
                    raise CheckpointError(f"unexpected tensor {stored!r} in {path.name}; this model has no such weight")
                _copy_into(target, f.get_tensor(stored), stored, path.name)
                loaded.add(name)
    check_all_loaded(targets, loaded)


def _copy_into(target: _Target, tensor: torch.Tensor, stored: str, file: str) -> None:
    dest = target.param.data[target.row_start : target.row_end]
    if tuple(tensor.shape) != tuple(dest.shape):
        raise CheckpointError(f"tensor {stored!r} in {file} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(tensor)


def check_all_loaded(targets, loaded: set[str]) -> None:
    """Raises CheckpointError naming (up to five of) the ``targets`` not in ``loaded``."""
    missing = sorted(set(targets) - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        hint = ""
        if "score.weight" in missing:  # a causal LM run as a classifier (--convert classify)
            hint = ("; a causal LM has no classification head: serve a *ForSequenceClassification checkpoint, "
                    "or build the head from tokens' rows of lm_head with --hf-overrides "
                    "'{\"classifier_from_token\": [\"no\", \"yes\"], \"method\": \"from_2_way_softmax\"}' "
                    "(docs/pooling.md)")
        raise CheckpointError(f"checkpoint is missing tensor(s): {shown}{hint}")
