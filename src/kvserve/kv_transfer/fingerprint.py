"""What KV blocks from outside the pool must agree on before they are used: the model (its config,
and each weight file's size and first and last bytes), the dtype the model runs in, the weights'
quantization, the KV cache's dtype, block size and heads per process, the tokenizer's files, and
kvserve's version. Blocks under another fingerprint are never looked up (a miss, never wrong KV).

The weight files are not hashed whole (tens of GB): a fine-tune of the same shapes changes the
bytes at their start (the first tensors) and end, which are hashed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import kvserve

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "merges.txt")
HEAD_BYTES = 4 << 20
TAIL_BYTES = 1 << 20


def _file_digest(path: Path, whole: bool) -> str:
    digest = hashlib.sha256()
    size = path.stat().st_size
    digest.update(str(size).encode())
    with open(path, "rb") as f:
        if whole or size <= HEAD_BYTES + TAIL_BYTES:
            digest.update(f.read())
        else:
            digest.update(f.read(HEAD_BYTES))
            f.seek(size - TAIL_BYTES)
            digest.update(f.read(TAIL_BYTES))
    return digest.hexdigest()


def _folder_facts(folder: str | None, names: tuple[str, ...] | None, suffixes: tuple[str, ...] = ()) -> dict:
    if not folder:
        return {}
    root = Path(folder)
    if root.is_file():  # a GGUF file given as the model
        return {root.name: _file_digest(root, whole=False)}
    if not root.is_dir():
        return {"name": folder}
    facts = {}
    for path in sorted(root.iterdir()):
        if path.is_file() and ((names and path.name in names) or (suffixes and path.suffix in suffixes)):
            facts[path.name] = _file_digest(path, whole=path.suffix not in WEIGHT_SUFFIXES)
    return facts


def kv_fingerprint(model: str, tokenizer: str | None, dtype: str, quantization: str, kv_cache_dtype: str,
                   block_size: int, num_kv_heads: int, hf_overrides: dict | None = None) -> str:
    """A 32-hex-digit key of everything a block's K/V depends on besides its tokens (see the
    module docstring)."""
    facts = {
        "kvserve": kvserve.__version__,
        "model": _folder_facts(model, ("config.json",), WEIGHT_SUFFIXES),
        "tokenizer": _folder_facts(tokenizer or model, TOKENIZER_FILES),
        "dtype": dtype, "quantization": quantization, "kv_cache_dtype": kv_cache_dtype,
        "block_size": block_size, "num_kv_heads": num_kv_heads, "hf_overrides": hf_overrides or {},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:32]
