"""A GGUF checkpoint (llama.cpp's single-file format): where it is, its metadata, and the
architecture it describes as a ``ModelArchConfig``.

``kvserve serve model.gguf`` (or a folder holding one ``.gguf`` and no ``config.json``) reads the
file with the ``gguf`` package's ``GGUFReader`` (a memory map; tensors are read when loaded).
The metadata keys are llama.cpp's (``gguf.constants.Keys``), prefixed by
``general.architecture``::

    {arch}.block_count                      -> num_hidden_layers
    {arch}.embedding_length                 -> hidden_size
    {arch}.feed_forward_length              -> intermediate_size
    {arch}.attention.head_count / _kv       -> num_attention_heads / num_key_value_heads
    {arch}.attention.key_length             -> head_dim (default hidden / heads)
    {arch}.attention.layer_norm_rms_epsilon -> rms_norm_eps
    {arch}.rope.freq_base                   -> rope_theta (default 10000)
    {arch}.rope.scaling.type / .factor      -> rope_scaling (none or linear; yarn is refused)
    {arch}.context_length                   -> max_position_embeddings
    token_embd.weight rows                  -> vocab_size;  no output.weight -> tied embeddings
    blk.0.attn_q.bias / ffn_gate.bias       -> attention_bias / mlp_bias
    tokenizer.ggml.bos/eos_token_id         -> bos/eos ids (eot/eom ids also end generation)

Architectures: ``llama`` (Llama, Mistral: llama.cpp's converter writes both as llama, with the q/k
rows permuted for its interleaved rotary layout, undone at load) -> ``LlamaForCausalLM``;
``qwen2`` -> ``Qwen2ForCausalLM``; ``qwen3`` -> ``Qwen3ForCausalLM`` (both NeoX-style rotary, not
permuted).
"""

from __future__ import annotations

import functools
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import Any

from kvserve.errors import CheckpointError
from kvserve.model.arch_config import ModelArchConfig

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# Token ids that end generation, beside eos (llama.cpp stops at every "end of generation" token).
_END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
# Metadata arrays not decoded here (the tokenizer reads them through transformers).
_SKIPPED_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
                   "tokenizer.ggml.token_type", "tokenizer.ggml.precompiled_charsmap")


def find_gguf(model: str | Path) -> Path | None:
    """The GGUF file ``model`` names: the path itself when it ends in ``.gguf``, the single
    ``*.gguf`` of a folder without ``config.json``, else None (a Hugging Face folder; one with a
    ``.gguf`` beside ``config.json`` is served from its safetensors).

    Raises:
        CheckpointError: the ``.gguf`` path is not a file, or the folder holds several ``.gguf``
            files (the message names them; serve one by its path).
    """
    path = Path(model)
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise CheckpointError(f"GGUF file {str(path)!r} does not exist")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(files) > 1:
        raise CheckpointError(f"{path} holds {len(files)} GGUF files ({', '.join(p.name for p in files)}); "
                              "serve one of them by its path")
    return files[0] if files else None


def open_gguf(path: str | Path) -> "GGUFFile":
    """The ``GGUFFile`` of ``path``, parsed once per process while the file is unchanged (same
    size and modification time): ``GGUFReader`` decodes every metadata array up front, which took
    13 s for a 151k-token vocabulary here, and a start-up reads the file from several places
    (flags, start-up checks, dtype, loader, end-of-sequence ids). At most two files are kept.

    Raises:
        CheckpointError: as ``GGUFFile``.
    """
    stat = Path(path).stat()
    return _open_cached(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _open_cached(path: str, mtime_ns: int, size: int) -> "GGUFFile":
    return GGUFFile(path)


class GGUFFile:
    """An opened GGUF file: metadata values and tensor records (``gguf.ReaderTensor``: name,
    ``tensor_type``, ``shape`` in GGML order (inputs first), ``data`` a memory map).

    Raises:
        CheckpointError: the file is not a GGUF file the ``gguf`` package can read.
    """

    def __init__(self, path: str | Path):
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self.reader = GGUFReader(str(self.path))
        except (ValueError, OSError, KeyError) as exc:
            raise CheckpointError(f"{self.path} is not a readable GGUF file: {exc}") from None
        self.tensors = {t.name: t for t in self.reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        """The value of metadata ``key`` (int, float, bool, str or a list of them), or ``default``."""
        field = self.reader.fields.get(key)
        return default if field is None or key in _SKIPPED_ARRAYS else _field_value(field)

    @property
    def gguf_architecture(self) -> str:
        return str(self.get("general.architecture", ""))

    def arch_key(self, name: str, default: Any = None) -> Any:
        """``{general.architecture}.{name}``, e.g. ``arch_key("block_count")``."""
        return self.get(f"{self.gguf_architecture}.{name}", default)

    def architecture(self) -> str:
        """kvserve's architecture name for the file.

        Raises:
            CheckpointError: ``general.architecture`` is missing or not one kvserve runs.
        """
        arch = self.gguf_architecture
        if arch not in ARCHITECTURES:
            raise CheckpointError(f"{self.path}: GGUF general.architecture {arch!r} is not supported; kvserve runs "
                                  f"{', '.join(ARCHITECTURES)} GGUF files")
        return ARCHITECTURES[arch]

    def end_token_ids(self) -> tuple[int, ...]:
        """eos, eot and eom ids the file declares (in that order, without repeats)."""
        ids = [int(v) for v in (self.get(k) for k in _END_KEYS) if v is not None]
        return tuple(dict.fromkeys(ids))

    def weight_types(self) -> str:
        """The GGML types of the 2-D weights, most frequent first, e.g. ``Q4_K+Q6_K`` or ``F16``."""
        counts = Counter(t.tensor_type.name for t in self.tensors.values() if len(t.shape) == 2)
        return "+".join(name for name, _ in counts.most_common())

    def stored_dtype(self) -> "torch.dtype | None":
        """The torch dtype of the file's most frequent float type among its 2-D weights (F32,
        F16, BF16), or None when every matrix is quantized."""
        import torch

        dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
        counts = Counter(t.tensor_type.name for t in self.tensors.values()
                         if len(t.shape) == 2 and t.tensor_type.name in dtypes)
        return dtypes[counts.most_common(1)[0][0]] if counts else None

    @cached_property
    def arch(self) -> ModelArchConfig:
        """The ``ModelArchConfig`` of the file (module docstring).

        Raises:
            CheckpointError: unsupported architecture, a required key missing, partial rotary
                (``rope.dimension_count`` != head_dim) or an unsupported rope scaling.
        """
        return ModelArchConfig.from_dict(self._config_dict(), source=str(self.path))

    def _config_dict(self) -> dict[str, Any]:
        architecture = self.architecture()

        def need(name: str) -> Any:
            value = self.arch_key(name)
            if value is None:
                raise CheckpointError(f"{self.path} lacks the GGUF key {self.gguf_architecture}.{name}")
            return value

        embd = self.tensors.get("token_embd.weight")
        if embd is None:
            raise CheckpointError(f"{self.path} has no token_embd.weight tensor")
        hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
        head_dim = int(self.arch_key("attention.key_length") or hidden // heads)
        rotary = self.arch_key("rope.dimension_count")
        if rotary is not None and int(rotary) != head_dim:
            raise CheckpointError(f"{self.path}: {self.gguf_architecture}.rope.dimension_count = {rotary} (partial "
                                  f"rotary) is not supported; kvserve rotates all {head_dim} dimensions of a head")
        end_ids = self.end_token_ids()
        config = {
            "architectures": [architecture], "model_type": self.gguf_architecture,
            "vocab_size": int(embd.shape[1]), "hidden_size": hidden,
            "intermediate_size": int(need("feed_forward_length")), "num_hidden_layers": int(need("block_count")),
            "num_attention_heads": heads, "num_key_value_heads": int(self.arch_key("attention.head_count_kv") or heads),
            "head_dim": head_dim, "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
            "rope_theta": float(self.arch_key("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self.arch_key("context_length", 2048)),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "mlp_bias": "blk.0.ffn_gate.bias" in self.tensors,
            "bos_token_id": self.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": list(end_ids) if end_ids else None,
        }
        if architecture != "Qwen2ForCausalLM":  # Qwen2 always has q/k/v biases
            config["attention_bias"] = "blk.0.attn_q.bias" in self.tensors
        scaling = self._rope_scaling()
        if scaling is not None:
            config["rope_scaling"] = scaling
        return config

    def _rope_scaling(self) -> dict[str, Any] | None:
        kind = self.arch_key("rope.scaling.type")
        if kind in (None, "none"):
            return None
        if kind == "linear":
            return {"rope_type": "linear", "factor": float(self.arch_key("rope.scaling.factor", 1.0))}
        raise CheckpointError(f"{self.path}: {self.gguf_architecture}.rope.scaling.type = {kind!r} is not "
                              "supported; kvserve runs none and linear rope scaling from GGUF files")


def _field_value(field) -> Any:
    """A ``gguf.ReaderField``'s value from its parts (``ReaderField.contents`` is newer than
    gguf 0.10)."""
    from gguf import GGUFValueType

    def scalar(part, kind) -> Any:
        return bytes(part).decode("utf-8") if kind == GGUFValueType.STRING else part.tolist()[0]

    if field.types[0] == GGUFValueType.ARRAY:
        return [scalar(field.parts[i], field.types[-1]) for i in field.data]
    return scalar(field.parts[field.data[0]], field.types[0])
