"""Reading and checking a PEFT LoRA folder against the base model.

A PEFT folder (``peft``'s ``save_pretrained``)::

    adapter_config.json          {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "use_rslora": false,
                                  "target_modules": ["q_proj", "v_proj"], "bias": "none", ...}
    adapter_model.safetensors    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight [r, in]
                                 base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight [out, r]

A LoRA module adds ``scaling * B (A x)`` to its projection's output (Hu et al. 2021, "LoRA"),
``scaling = lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora`` (Kalajdzievski
2023, "rsLoRA"). The scaling is folded into ``B`` here. PEFT's modules map onto kvserve's fused
projections (``kvserve.model.llama``)::

    q_proj, k_proj, v_proj  -> self_attn.qkv_proj shards 0, 1, 2
    o_proj                  -> self_attn.o_proj
    gate_proj, up_proj      -> mlp.gate_up_proj shards 0, 1
    down_proj               -> mlp.down_proj

Supported: plain LoRA on those seven modules, ``bias: "none"``. Everything else PEFT can write
(DoRA, embedding or LM-head adapters, ``modules_to_save``, bias terms, per-module rank or alpha
patterns, ...) is refused with one line naming the field, as is a rank above ``--max-lora-rank``
or a tensor whose shape does not fit the base model.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from kvserve.errors import KVServeError
from kvserve.model.arch_config import ModelArchConfig

# PEFT module -> (our module, shard index)
MODULE_MAP: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}
SUPPORTED_TARGETS = tuple(MODULE_MAP)


def check_base_model(arch: ModelArchConfig) -> None:
    """Refuses, by name, a base model whose layers LoRA adapters are not applied to here.

    Raises:
        ConfigError: a mixture-of-experts model (its experts' linears and the dense layers'
            would need adapters of their own shapes).
    """
    if arch.moe is not None:
        from kvserve.errors import ConfigError

        raise ConfigError(f"--enable-lora: LoRA adapters on mixture-of-experts models ({arch.architecture}) are not "
                          "supported; serve the model without --enable-lora")
# Fields that must be absent or empty/false: each names a PEFT feature kvserve does not apply.
_UNSUPPORTED_FIELDS: dict[str, str] = {
    "use_dora": "DoRA adapters are not supported",
    "modules_to_save": "adapters that replace whole modules are not supported",
    "lora_bias": "LoRA bias terms are not supported",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D-style) weights are not supported",
    "rank_pattern": "per-module ranks are not supported",
    "alpha_pattern": "per-module alphas are not supported",
    "target_parameters": "adapters on parameters (not modules) are not supported",
    "trainable_token_indices": "trainable token embeddings are not supported",
    "layer_replication": "layer replication is not supported",
    "alora_invocation_tokens": "activated LoRA (aLoRA) is not supported",
    "use_qalora": "QA-LoRA is not supported",
    "megatron_config": "Megatron-parallel adapters are not supported",
}
_TENSOR_NAME = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


class LoRAAdapterError(KVServeError, ValueError):
    """An adapter folder kvserve cannot serve; ``field`` names the config field or tensor at fault
    (None for a missing file)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class ModuleLoRA:
    """One projection's adapter, per shard (None where the shard has no adapter).

    Attributes:
        a: per shard, ``A`` [rank, in_features].
        b: per shard, ``scaling * B`` [shard out_features, rank].
    """

    a: tuple[torch.Tensor | None, ...]
    b: tuple[torch.Tensor | None, ...]


@dataclass(frozen=True)
class LoRAWeights:
    """A loaded adapter: ``modules[(layer index, module name)]`` (module names as in
    ``MODULE_MAP``'s values), weights on the CPU in the requested dtype."""

    rank: int
    scaling: float
    modules: dict[tuple[int, str], ModuleLoRA]

    @property
    def num_bytes(self) -> int:
        tensors = [t for m in self.modules.values() for t in (*m.a, *m.b) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


def module_shapes(arch: ModelArchConfig) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Our module name -> (in_features, out_features of each shard) for ``arch``."""
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_key_value_heads * arch.head_dim
    hidden, inter = arch.hidden_size, arch.intermediate_size
    return {
        "qkv_proj": (hidden, (q, kv, kv)),
        "o_proj": (q, (hidden,)),
        "gate_up_proj": (hidden, (inter, inter)),
        "down_proj": (inter, (hidden,)),
    }


def read_adapter_config(path: str | Path, max_lora_rank: int) -> dict[str, Any]:
    """``adapter_config.json`` of ``path``, checked (see the module docstring).

    Raises:
        LoRAAdapterError: a missing or unreadable file, or a field kvserve cannot serve (named).
    """
    folder = Path(path)
    config_path = folder / ADAPTER_CONFIG
    if not folder.is_dir():
        raise LoRAAdapterError(f"LoRA adapter folder {str(folder)!r} does not exist")
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise LoRAAdapterError(f"{config_path} is missing: not a PEFT adapter folder") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise LoRAAdapterError(f"{config_path} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise LoRAAdapterError(f"{config_path} must hold a JSON object")
    _check_fields(config, max_lora_rank)
    return config


def _check_fields(config: dict[str, Any], max_lora_rank: int) -> None:
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise LoRAAdapterError(f"peft_type {peft_type!r} is not supported: only LORA adapters are", "peft_type")
    for name, why in _UNSUPPORTED_FIELDS.items():
        if config.get(name):
            raise LoRAAdapterError(f"{name}={config[name]!r}: {why}", name)
    bias = config.get("bias", "none")
    if bias != "none":
        raise LoRAAdapterError(f"bias={bias!r}: only bias 'none' is supported", "bias")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoRAAdapterError(f"r={rank!r}: the rank must be an integer >= 1", "r")
    if rank > max_lora_rank:
        raise LoRAAdapterError(f"r={rank} exceeds --max-lora-rank {max_lora_rank}; start the server with "
                               f"--max-lora-rank {rank} or more", "r")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise LoRAAdapterError(f"lora_alpha={alpha!r}: must be a finite number", "lora_alpha")
    targets = config.get("target_modules")
    if isinstance(targets, (list, tuple)):  # names, or dotted paths ("model.layers.1.mlp.up_proj") matched by suffix
        unknown = [t for t in targets if str(t).rsplit(".", 1)[-1] not in SUPPORTED_TARGETS and t != "all-linear"]
        if unknown:
            raise LoRAAdapterError(f"target_modules: {unknown[0]!r} is not supported (supported: "
                                   f"{', '.join(SUPPORTED_TARGETS)})", "target_modules")


def scaling_of(config: dict[str, Any]) -> float:
    """PEFT's ``scaling``: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora``."""
    rank, alpha = config["r"], config.get("lora_alpha", 8)
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def _tensor_targets(names: list[str], arch: ModelArchConfig) -> dict[str, tuple[int, str, int, str]]:
    """Tensor name -> (layer, our module, shard, "A" or "B").

    Raises:
        LoRAAdapterError: a tensor of a module kvserve does not adapt (named), or a layer index
            beyond the base model's.
    """
    targets = {}
    for name in names:
        match = _TENSOR_NAME.match(name)
        module = match.group(2) if match else None
        if match is None or module not in MODULE_MAP:
            raise LoRAAdapterError(f"tensor {name!r} is not supported: kvserve adapts "
                                   f"{', '.join(SUPPORTED_TARGETS)} of the decoder layers only", "target_modules")
        layer = int(match.group(1))
        if layer >= arch.num_hidden_layers:
            raise LoRAAdapterError(f"tensor {name!r}: layer {layer} does not exist (the base model has "
                                   f"{arch.num_hidden_layers} layers)", name)
        ours, shard = MODULE_MAP[module]
        targets[name] = (layer, ours, shard, match.group(3))
    return targets


def _check_shape(name: str, shape: tuple[int, ...], expected: tuple[int, int]) -> None:
    if tuple(shape) != expected:
        raise LoRAAdapterError(f"tensor {name!r} has shape {list(shape)}, the base model needs {list(expected)}: "
                               "the adapter was trained for another base model", name)


def load_adapter(path: str | Path, arch: ModelArchConfig, max_lora_rank: int,
                 dtype: torch.dtype | None = torch.float32) -> LoRAWeights:
    """Read and check a PEFT adapter for ``arch``; ``dtype=None`` checks names and shapes only
    (no tensor is read: the front end's check at registration) and returns empty modules.

    Raises:
        LoRAAdapterError: the folder cannot be served (the message names the field or tensor).
    """
    config = read_adapter_config(path, max_lora_rank)
    rank, scaling = config["r"], scaling_of(config)
    weights_path = Path(path) / ADAPTER_WEIGHTS
    if not weights_path.is_file():
        raise LoRAAdapterError(f"{weights_path} is missing (kvserve reads safetensors adapters; save with "
                               "peft's save_pretrained(safe_serialization=True))", ADAPTER_WEIGHTS)
    shapes = module_shapes(arch)
    parts: dict[tuple[int, str], dict[tuple[int, str], torch.Tensor | None]] = {}
    try:
        with safe_open(str(weights_path), framework="pt") as f:
            names = list(f.keys())
            targets = _tensor_targets(names, arch)
            for name, (layer, module, shard, kind) in targets.items():
                in_features, outs = shapes[module]
                expected = (rank, in_features) if kind == "A" else (outs[shard], rank)
                _check_shape(name, tuple(f.get_slice(name).get_shape()), expected)
                tensor = None if dtype is None else _scaled(f.get_tensor(name), kind, scaling, dtype)
                parts.setdefault((layer, module), {})[(shard, kind)] = tensor
    except LoRAAdapterError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt file is the adapter's fault, reported as such
        raise LoRAAdapterError(f"{weights_path} cannot be read: {type(exc).__name__}: {exc}") from None
    if not parts:
        raise LoRAAdapterError(f"{weights_path} holds no LoRA tensor", ADAPTER_WEIGHTS)
    modules = {key: _module(key, found, len(shapes[key[1]][1])) for key, found in parts.items()}
    return LoRAWeights(rank=rank, scaling=scaling, modules=modules if dtype is not None else {})


def _scaled(tensor: torch.Tensor, kind: str, scaling: float, dtype: torch.dtype) -> torch.Tensor:
    tensor = tensor.to(torch.float32)
    if kind == "B":
        tensor = tensor * scaling
    return tensor.to(dtype).contiguous()


def _module(key: tuple[int, str], found: dict, num_shards: int) -> ModuleLoRA:
    a, b = [], []
    for shard in range(num_shards):
        has_a, has_b = (shard, "A") in found, (shard, "B") in found
        if has_a != has_b:
            missing = "lora_B" if has_a else "lora_A"
            raise LoRAAdapterError(f"layer {key[0]} {key[1]} shard {shard}: {missing} is missing", missing)
        a.append(found.get((shard, "A")))
        b.append(found.get((shard, "B")))
    return ModuleLoRA(tuple(a), tuple(b))
