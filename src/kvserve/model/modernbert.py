"""ModernBERT (Warner et al. 2024, "Smarter, Better, Faster, Longer: A Modern Bidirectional
Encoder"), for pooling (embeddings): a pre-norm encoder with rotary positions, alternating global
and local (sliding-window) bidirectional attention and a GeGLU feed-forward; no KV cache, no
language-model head.

Parameter names are transformers' ``ModernBertModel`` names::

    embeddings.tok_embeddings, embeddings.norm
    layers.{i}.attn_norm (none in layer 0), layers.{i}.attn.{Wqkv,Wo}
    layers.{i}.mlp_norm, layers.{i}.mlp.{Wi,Wo}                 Wi rows = [input | gate]
    final_norm

Layer ``i`` is global (``full_attention``) or local (``sliding_attention``: a token sees the
tokens within ``local_attention // 2`` positions) as config.json's ``layer_types`` says, or, in
older configs, global every ``global_attn_every_n_layers`` layers from layer 0. Global layers
rotate with ``rope_parameters.full_attention.rope_theta`` (``global_rope_theta``, 160,000), local
ones with the sliding layers' (``local_rope_theta``, 10,000). LayerNorms have no bias unless
``norm_bias``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.errors import CheckpointError
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.bert import ENCODER_ACTIVATIONS
from kvserve.model.encoder_attention import encoder_attention
from kvserve.model.layers import RotaryEmbedding
from kvserve.model.meta_init import embedding

_GLOBAL_THETA, _LOCAL_THETA = 160_000.0, 10_000.0


def layer_windows(arch: ModelArchConfig) -> list[int | None]:
    """Per layer the local attention's full window (``local_attention``), or None for a global layer."""
    raw = arch.raw
    window = int(raw.get("local_attention", 128))
    types = raw.get("layer_types")
    if not types:
        every = int(raw.get("global_attn_every_n_layers", 3))
        types = ["sliding_attention" if i % every else "full_attention" for i in range(arch.num_hidden_layers)]
    return [window if kind == "sliding_attention" else None for kind in types]


def rope_thetas(arch: ModelArchConfig) -> tuple[float, float]:
    """(global theta, local theta) from transformers 5's per-layer-type ``rope_parameters`` or the
    older ``global_rope_theta`` / ``local_rope_theta`` fields.

    Raises:
        CheckpointError: a rope type other than the default one.
    """
    if arch.rope_scaling is not None:
        raise CheckpointError(f"{arch.architecture}: rope type {arch.rope_scaling.rope_type!r} is not supported; "
                              "supported: default")
    params = arch.raw.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        return arch.rope_theta, arch.local_rope_theta or _LOCAL_THETA
    return (float(arch.raw.get("global_rope_theta", _GLOBAL_THETA)),
            float(arch.raw.get("local_rope_theta", _LOCAL_THETA)))


class ModernBertEmbeddings(nn.Module):
    """Token embedding then LayerNorm (no position embedding: the layers rotate)."""

    def __init__(self, arch: ModelArchConfig, eps: float, bias: bool):
        super().__init__()
        self.tok_embeddings = embedding(arch.vocab_size, arch.hidden_size)
        self.norm = nn.LayerNorm(arch.hidden_size, eps=eps, bias=bias)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertAttention(nn.Module):
    """Fused ``Wqkv``, rotary queries and keys, bidirectional attention (windowed in local
    layers), ``Wo``: [T, H] -> [T, H]."""

    def __init__(self, arch: ModelArchConfig, window: int | None):
        super().__init__()
        self.num_heads = arch.num_attention_heads
        self.head_dim = arch.hidden_size // self.num_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.window = window
        bias = bool(arch.raw.get("attention_bias", False))
        self.Wqkv = nn.Linear(arch.hidden_size, 3 * arch.hidden_size, bias=bias)
        self.Wo = nn.Linear(arch.hidden_size, arch.hidden_size, bias=bias)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.Wqkv(hidden).view(hidden.shape[0], 3, self.num_heads, self.head_dim).unbind(1)
        q, k = RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin)
        out = encoder_attention(q, k, v, metadata, self.scale, self.window)
        return self.Wo(out.reshape(hidden.shape[0], -1))


class ModernBertMLP(nn.Module):
    """GeGLU: ``Wo(act(input) * gate)`` with ``[input | gate] = Wi(x)``."""

    def __init__(self, arch: ModelArchConfig):
        super().__init__()
        bias = bool(arch.raw.get("mlp_bias", False))
        self.Wi = nn.Linear(arch.hidden_size, 2 * arch.intermediate_size, bias=bias)
        self.Wo = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=bias)
        self.act = ENCODER_ACTIVATIONS[arch.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.act(hidden) * gate)


class ModernBertEncoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(attn_norm(h)); h += mlp(mlp_norm(h))`` (layer 0 has no attn_norm:
    the embedding's norm precedes it)."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, window: int | None, eps: float, bias: bool):
        super().__init__()
        self.attn_norm = nn.Identity() if layer_idx == 0 else nn.LayerNorm(arch.hidden_size, eps=eps, bias=bias)
        self.attn = ModernBertAttention(arch, window)
        self.mlp_norm = nn.LayerNorm(arch.hidden_size, eps=eps, bias=bias)
        self.mlp = ModernBertMLP(arch)

    def forward(self, hidden, cos, sin, metadata):
        hidden = hidden + self.attn(self.attn_norm(hidden), cos, sin, metadata)
        return hidden + self.mlp(self.mlp_norm(hidden))


class ModernBertModel(nn.Module):
    """ModernBERT as an embedding model (vLLM's ``ModernBertModel``; pooling: CLS by default).

    ``forward(input_ids int64 [T], positions int64 [T], kv_caches (unused), attn_metadata)`` ->
    final hidden states [T, hidden_size] (after ``final_norm``) in the model dtype.
    """

    attn_type = "encoder_only"  # bidirectional: whole prompts, no KV cache (kvserve.model.registry)
    default_pooling_type = "CLS"
    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    checkpoint_ignored: tuple[str, ...] = ("head.", "decoder.")
    split_checkpoint_tensor = None

    def __init__(self, arch: ModelArchConfig, attn_backend: AttentionBackend | None = None):
        super().__init__()
        self.arch = arch
        eps, bias = float(arch.raw.get("norm_eps", 1e-5)), bool(arch.raw.get("norm_bias", False))
        windows = layer_windows(arch)
        self.embeddings = ModernBertEmbeddings(arch, eps, bias)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(arch, i, windows[i], eps, bias)
                                    for i in range(arch.num_hidden_layers))
        self.final_norm = nn.LayerNorm(arch.hidden_size, eps=eps, bias=bias)
        head_dim = arch.hidden_size // arch.num_attention_heads
        global_theta, local_theta = rope_thetas(arch)
        self.global_rotary = RotaryEmbedding(head_dim, global_theta, None)
        self.local_rotary = RotaryEmbedding(head_dim, local_theta, None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden = self.embeddings(input_ids)
        rotations = {None: self.global_rotary.cos_sin(positions, hidden.dtype)}
        for layer in self.layers:
            window = layer.attn.window
            if window not in rotations:
                rotations[window] = self.local_rotary.cos_sin(positions, hidden.dtype)
            hidden = layer(hidden, *rotations[window], attn_metadata)
        return self.final_norm(hidden)
