"""A pre-quantized checkpoint's ``quantization_config`` (config.json): parsed, checked against what
kvserve loads, and reconciled with ``--quantization`` as vLLM does (the checkpoint's method is
used when the flag is absent; a flag that names another method stops the start).

Loaded (the tensors: ``kvserve.model.prequantized``)::

    quant_method gptq   bits 4 (8: symmetric only), group_size -1 or > 0, desc_act true/false, sym true/false,
                        checkpoint_format (or format) gptq (v1) / gptq_v2, lm_head true/false,
                        dynamic with "-:" exclusions only (those modules are stored in float)
    quant_method awq    bits (w_bit) 4, group_size (q_group_size), zero_point true,
                        version (or format) gemm, modules_to_not_convert (stored in float)
    quant_method mxfp4  GPT-OSS's experts (E2M1 values, an E8M0 scale per 32 inputs),
                        modules_to_not_convert (stored in float: the rest of the model)

Anything else is refused in one line naming the field, e.g.
``config.json: quantization_config.version = 'gemv': ...``. No torch here: the flag parser uses it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvserve.config import CHECKPOINT_METHODS, CheckpointQuantization, QuantizationConfig
from kvserve.errors import CheckpointError, ConfigError

_GPTQ_FORMATS = ("gptq", "gptq_v2")
_BITS = {"gptq": (4, 8), "awq": (4,), "mxfp4": (4,)}
_AWQ_FORMATS = ("gemm",)
# Files older quantizers wrote beside config.json (AutoGPTQ, AutoAWQ); kvserve reads config.json's.
_SIDE_FILES = ("quantize_config.json", "quant_config.json")
_FLOAT_ADVICE = "serve the float checkpoint, quantized at load with --quantization int8 or int4"


def read_checkpoint_quantization(model_dir: str | Path) -> CheckpointQuantization | None:
    """The parsed ``quantization_config`` of ``model_dir/config.json``; None for a float checkpoint
    (and when config.json is missing or not JSON: ``startup_checks.check_architecture`` says so).

    Raises:
        CheckpointError: a quantization kvserve does not load (the message names the field), or
            an AutoGPTQ/AutoAWQ side file without ``quantization_config`` in config.json.
    """
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    stored = raw.get("quantization_config") if isinstance(raw, dict) else None
    if stored is None:
        side = [name for name in _SIDE_FILES if (model_dir / name).is_file()]
        if side:
            raise CheckpointError(f"{model_dir / side[0]} describes a quantized checkpoint but {path} has no "
                                  "quantization_config; kvserve reads it from config.json (as transformers does): "
                                  "copy it there with its quant_method")
        return None
    return parse_quantization_config(stored, f"{path}: quantization_config")


def parse_quantization_config(stored: Any, where: str = "quantization_config") -> CheckpointQuantization:
    """``stored`` (the ``quantization_config`` object) as a ``CheckpointQuantization``.

    Raises:
        CheckpointError: ``<where>.<field> = <value>: <why>`` for the first field kvserve cannot load.
    """
    if not isinstance(stored, dict):
        raise CheckpointError(f"{where} = {stored!r}: expected an object with a quant_method")
    method = str(stored.get("quant_method", "")).lower()
    if method not in CHECKPOINT_METHODS:
        raise CheckpointError(f"{where}.quant_method = {stored.get('quant_method')!r}: kvserve loads "
                              f"{' and '.join(CHECKPOINT_METHODS)} checkpoints; {_FLOAT_ADVICE}")
    if method == "mxfp4":
        return _mxfp4(stored, where)
    bits = _field(stored, where, ("bits", "w_bit"), 4, int)
    if bits not in _BITS[method]:
        allowed = " and ".join(map(str, _BITS[method]))
        raise CheckpointError(f"{where}.bits = {bits}: kvserve loads {allowed}-bit {method} checkpoints; "
                              f"{_FLOAT_ADVICE}")
    group_size = _field(stored, where, ("group_size", "q_group_size"), 128, int)
    if group_size != -1 and group_size <= 0:
        raise CheckpointError(f"{where}.group_size = {group_size}: expected -1 (per channel) or a positive size")
    if method == "gptq":
        return _gptq(stored, where, bits, group_size)
    return _awq(stored, where, group_size)


def _gptq(stored: dict, where: str, bits: int, group_size: int) -> CheckpointQuantization:
    key = "checkpoint_format" if "checkpoint_format" in stored else "format"
    fmt = str(stored.get(key) or "gptq").lower()
    if fmt not in _GPTQ_FORMATS:
        raise CheckpointError(f"{where}.{key} = {stored.get(key)!r}: kvserve reads GPTQ's own layouts "
                              f"({', '.join(_GPTQ_FORMATS)}), not kernel-specific repacks")
    pack_dtype = str(stored.get("pack_dtype", "int32")).removeprefix("torch.")
    if pack_dtype != "int32":
        raise CheckpointError(f"{where}.pack_dtype = {stored['pack_dtype']!r}: kvserve reads int32-packed GPTQ tensors")
    dynamic = stored.get("dynamic") or {}
    overrides = [rule for rule in dynamic if not str(rule).startswith("-:")]
    if overrides:
        raise CheckpointError(f"{where}.dynamic = {{{overrides[0]!r}: ...}}: per-module bits/group overrides are "
                              "not supported (only '-:' exclusions, whose modules are stored in float)")
    return CheckpointQuantization(
        method="gptq", bits=bits, group_size=group_size, desc_act=_field(stored, where, ("desc_act",), False, bool),
        sym=_field(stored, where, ("sym",), True, bool), checkpoint_format=fmt,
        lm_head=_field(stored, where, ("lm_head",), False, bool),
    )


def _awq(stored: dict, where: str, group_size: int) -> CheckpointQuantization:
    key = "version" if "version" in stored else "format"
    fmt = str(stored.get(key) or "gemm").lower()
    if fmt not in _AWQ_FORMATS:
        raise CheckpointError(f"{where}.{key} = {stored.get(key)!r}: kvserve reads AWQ's GEMM layout "
                              f"({key} 'gemm'); re-export the checkpoint with AutoAWQ's GEMM version")
    if not _field(stored, where, ("zero_point",), True, bool):
        raise CheckpointError(f"{where}.zero_point = false: kvserve reads AWQ checkpoints with zero points")
    return CheckpointQuantization(method="awq", bits=4, group_size=group_size, desc_act=False, sym=False,
                                  checkpoint_format=fmt, lm_head=False)


def _mxfp4(stored: dict, where: str) -> CheckpointQuantization:
    known = {"quant_method", "modules_to_not_convert", "dequantize"}
    unknown = sorted(set(stored) - known)
    if unknown:
        raise CheckpointError(f"{where}.{unknown[0]} = {stored[unknown[0]]!r}: not a field of the MXFP4 checkpoints "
                              "kvserve loads (quant_method, modules_to_not_convert)")
    if stored.get("dequantize"):
        raise CheckpointError(f"{where}.dequantize = true: kvserve keeps MXFP4 experts 4-bit; drop the field")
    return CheckpointQuantization(method="mxfp4", bits=4, group_size=32, desc_act=False, sym=True,
                                  checkpoint_format="mxfp4", lm_head=False)


def _field(stored: dict, where: str, names: tuple[str, ...], default: Any, kind: type) -> Any:
    """The first of ``names`` present (else ``default``), checked to be a ``kind`` (bool is not int)."""
    for name in names:
        if name in stored and stored[name] is not None:
            value = stored[name]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise CheckpointError(f"{where}.{name} = {value!r}: expected {kind.__name__}")
            return value
    return default


def resolve_quantization(model_dir: str | Path, requested: QuantizationConfig) -> QuantizationConfig:
    """What the engine runs: ``requested`` (from the flags) reconciled with the checkpoint, as vLLM
    does: a gptq/awq checkpoint gives its method when ``--quantization`` is absent; a
    ``--quantization`` that names another method, ``--quantization gptq|awq`` on a float
    checkpoint and ``--quantize-lm-head`` on a pre-quantized one are refused. Idempotent.

    Raises:
        ConfigError: the flag and the checkpoint disagree (one line, naming both).
        CheckpointError: as ``read_checkpoint_quantization``.
    """
    if requested.checkpoint is not None:
        return requested
    stored = read_checkpoint_quantization(model_dir)
    if stored is None:
        if requested.method in CHECKPOINT_METHODS:
            raise ConfigError(f"--quantization {requested.method}: {model_dir} has no quantization_config in "
                              f"config.json, so it is not a {requested.method} checkpoint; omit the flag, or use "
                              "int8/int4 to quantize its float weights at load")
        return requested
    if requested.method not in (None, stored.method):
        raise ConfigError(f"--quantization {requested.method} contradicts the checkpoint: {model_dir} is quantized "
                          f"with {stored.method} (config.json quantization_config.quant_method); omit the flag or "
                          f"pass --quantization {stored.method}")
    if requested.lm_head:
        raise ConfigError(f"--quantize-lm-head applies to int8/int4 made at load; a {stored.method} checkpoint's "
                          "LM head is used as stored")
    return QuantizationConfig(method=stored.method, group_size=stored.group_size, lm_head=stored.lm_head,
                              checkpoint=stored)
