"""Checks that turn the common start-up mistakes into one actionable line, before any weight is read.

    kvserve serve ./gpt2          -> architecture GPT2LMHeadModel (model_type gpt2) is not supported; ...
    kvserve serve ./bin-only      -> ... holds PyTorch .bin weights and no safetensors; convert them once: ...
    --kv-cache-memory-bytes 1MiB  -> ... one request of max_model_len=4096 needs 24.0 MiB: give at least ...

Each raises :class:`~kvserve.errors.CheckpointError` or ``ValueError``; ``kvserve.cli`` prints the
message as ``kvserve: error: ...`` and exits with status 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvserve.errors import CheckpointError

_OTHER_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.gguf", "*.ckpt", "*.h5", "*.msgpack")


def supported_architectures() -> list[str]:
    from kvserve.model.registry import supported_architectures as registered

    return registered()


def check_architecture(model_dir: str | Path, hf_overrides: Mapping[str, Any] | None = None) -> str:
    """The folder's ``architectures[0]`` (a GGUF file's: ``kvserve.model.gguf_file``), if kvserve
    runs it (``hf_overrides``: ``--hf-overrides``, laid over config.json).

    Raises:
        CheckpointError: no/invalid config.json, an architecture kvserve does not run (the
            message names it, its ``model_type`` and the supported list), or a
            ``quantization_config`` it does not load (``kvserve.checkpoint_quantization``); an
            unreadable GGUF file or one of another architecture.
    """
    from kvserve.model.gguf_file import find_gguf, open_gguf
    from kvserve.model.hf_overrides import read_config_json

    gguf = find_gguf(model_dir)
    if gguf is not None:
        return open_gguf(gguf).architecture()
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir} has no config.json; a Hugging Face model folder holds config.json, "
                              "*.safetensors and the tokenizer files")
    raw = read_config_json(model_dir, hf_overrides)
    architectures = raw.get("architectures") or []
    supported = supported_architectures()
    if not architectures:
        raise CheckpointError(f"{path} names no 'architectures'; kvserve runs {', '.join(supported)}")
    architecture = architectures[0]
    if architecture not in supported:
        model_type = f" (model_type {raw['model_type']})" if raw.get("model_type") else ""
        raise CheckpointError(f"{model_dir}: architecture {architecture}{model_type} is not supported; "
                              f"kvserve runs {', '.join(supported)}")
    from kvserve.checkpoint_quantization import read_checkpoint_quantization

    read_checkpoint_quantization(model_dir)  # a quantization_config kvserve does not load, named
    return architecture


def missing_safetensors_message(model_dir: str | Path) -> str:
    """What to say when a folder has no safetensors weights (naming the weights it does have)."""
    model_dir = Path(model_dir)
    others = sorted({p.name for pattern in _OTHER_WEIGHTS for p in model_dir.glob(pattern)})
    if not others:
        return (f"no weights in {model_dir}: expected model.safetensors or model.safetensors.index.json "
                "with its shards")
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return (f"{model_dir} holds {shown} and no safetensors weights; kvserve reads safetensors only. Convert once "
            f"with transformers: python -c \"from transformers import AutoModelForCausalLM as M; "
            f"M.from_pretrained('{model_dir}').save_pretrained('{model_dir}')\"")


def check_weights(model_dir: str | Path) -> None:
    """Raises CheckpointError (:func:`missing_safetensors_message`) when there are no safetensors
    (a GGUF file holds its weights)."""
    from kvserve.model.gguf_file import find_gguf

    if find_gguf(model_dir) is not None:
        return
    model_dir = Path(model_dir)
    if not ((model_dir / "model.safetensors.index.json").is_file() or (model_dir / "model.safetensors").is_file()):
        raise CheckpointError(missing_safetensors_message(model_dir))


def check_kv_budget(budget_bytes: int | None, bytes_per_block: int, block_size: int, max_model_len: int) -> None:
    """Refuse a ``--kv-cache-memory-bytes`` too small for one request of ``max_model_len`` tokens.

    Raises:
        ValueError: the budget holds fewer blocks than one such request needs; the message gives
            the smallest budget that works (rounded up to a MiB).
    """
    if budget_bytes is None:
        return
    needed_blocks = math.ceil(max_model_len / block_size)
    needed = needed_blocks * bytes_per_block
    if budget_bytes >= needed:
        return
    need_mib = math.ceil(needed / 2**20)
    raise ValueError(
        f"--kv-cache-memory-bytes {_human(budget_bytes)} holds {budget_bytes // bytes_per_block} blocks of "
        f"{block_size} tokens; one request of max_model_len={max_model_len} needs {needed_blocks} blocks "
        f"({needed / 2**20:.1f} MiB): give --kv-cache-memory-bytes {need_mib}MiB or more, or lower --max-model-len")


def _human(num_bytes: int) -> str:
    if num_bytes >= 2**30:
        return f"{num_bytes / 2**30:.1f}GiB"
    if num_bytes >= 2**20:
        return f"{num_bytes / 2**20:.1f}MiB"
    return f"{num_bytes}B"
