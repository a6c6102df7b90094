"""BERT (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers") and RoBERTa /
XLM-RoBERTa (Liu et al. 2019; Conneau et al. 2020) encoders, for pooling (embeddings): the
post-norm transformer with absolute position embeddings and bidirectional attention
(``kvserve.model.encoder_attention``), no KV cache and no language-model head.

Parameter names are transformers' ``BertModel`` / ``XLMRobertaModel`` names, except the fused
query/key/value projection::

    embeddings.{word,position,token_type}_embeddings, embeddings.LayerNorm
    encoder.layer.{i}.attention.self.qkv_proj   = rows [query | key | value]
    encoder.layer.{i}.attention.output.{dense,LayerNorm}
    encoder.layer.{i}.intermediate.dense, encoder.layer.{i}.output.{dense,LayerNorm}

The checkpoint's ``pooler.dense`` (BERT's next-sentence head) is not loaded: embeddings pool the
final hidden states, as vLLM's ``BertEmbeddingModel`` (the sequence classifiers of
``kvserve.model.bert_classifier`` load it). A token's type is 0 (the first segment) unless the step
gives ``token_type_ids`` (a cross-encoder's (query, document) pair: 1 on the document's tokens).
RoBERTa's positions start after the padding id: position ``p`` of a prompt reads row
``pad_token_id + 1 + p`` (transformers' ``create_position_ids_from_input_ids`` for a prompt
without padding), so its context is ``max_position_embeddings - pad_token_id - 1`` tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.encoder_attention import encoder_attention
from kvserve.model.layers import MergedLinear
from kvserve.model.meta_init import embedding

# Encoder activations by config.json's name (transformers' ACT2FN): exact GELU, its tanh form, ReLU.
ENCODER_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm: ids [T], positions [T], token
    types [T] (int64; None: every token type 0) -> [T, hidden]. ``position_offset``: added to every
    position (RoBERTa: ``pad_token_id + 1``)."""

    def __init__(self, arch: ModelArchConfig, position_offset: int = 0):
        super().__init__()
        raw = arch.raw
        self.word_embeddings = embedding(arch.vocab_size, arch.hidden_size)
        self.position_embeddings = embedding(int(raw["max_position_embeddings"]), arch.hidden_size)
        self.token_type_embeddings = embedding(int(raw.get("type_vocab_size", 2)), arch.hidden_size)
        self.LayerNorm = nn.LayerNorm(arch.hidden_size, eps=float(raw.get("layer_norm_eps", 1e-12)))
        self.position_offset = position_offset

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        types = self.token_type_embeddings.weight[0] if token_type_ids is None else self.token_type_embeddings(
            token_type_ids)
        hidden = self.word_embeddings(input_ids) + types
        hidden = hidden + self.position_embeddings(positions + self.position_offset)
        return self.LayerNorm(hidden)


class BertSelfAttention(nn.Module):
    """Multi-head attention with the fused ``qkv_proj``: hidden [T, H] -> context [T, H]."""

    def __init__(self, arch: ModelArchConfig):
        super().__init__()
        self.num_heads = arch.num_attention_heads
        self.head_dim = arch.hidden_size // self.num_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        size = self.num_heads * self.head_dim
        self.qkv_proj = MergedLinear(arch.hidden_size, [size, size, size], ["query", "key", "value"], bias=True)

    def forward(self, hidden: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).view(hidden.shape[0], 3, self.num_heads, self.head_dim).unbind(1)
        return encoder_attention(q, k, v, metadata, self.scale).reshape(hidden.shape[0], -1)


class BertDenseNorm(nn.Module):
    """A sublayer's output: ``LayerNorm(dense(x) + residual)`` (transformers' ``BertSelfOutput``
    and ``BertOutput``)."""

    def __init__(self, in_features: int, out_features: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(in_features, out_features)
        self.LayerNorm = nn.LayerNorm(out_features, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    """``self`` (the attention) and ``output`` (its projection, residual and norm)."""

    def __init__(self, arch: ModelArchConfig, eps: float):
        super().__init__()
        self.self = BertSelfAttention(arch)
        self.output = BertDenseNorm(arch.hidden_size, arch.hidden_size, eps)

    def forward(self, hidden: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        return self.output(self.self(hidden, metadata), hidden)


class BertIntermediate(nn.Module):
    """``act(dense(x))``: [T, H] -> [T, intermediate]."""

    def __init__(self, arch: ModelArchConfig):
        super().__init__()
        self.dense = nn.Linear(arch.hidden_size, arch.intermediate_size)
        self.act = ENCODER_ACTIVATIONS[arch.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    """Post-norm block: ``h = LN(attn(h) + h); h = LN(W2 act(W1 h) + h)``."""

    def __init__(self, arch: ModelArchConfig, eps: float):
        super().__init__()
        self.attention = BertAttention(arch, eps)
        self.intermediate = BertIntermediate(arch)
        self.output = BertDenseNorm(arch.intermediate_size, arch.hidden_size, eps)

    def forward(self, hidden: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        hidden = self.attention(hidden, metadata)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(self, arch: ModelArchConfig, eps: float):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(arch, eps) for _ in range(arch.num_hidden_layers))


class BertModel(nn.Module):
    """BERT as an embedding model (vLLM's ``BertEmbeddingModel``; pooling: CLS by default).

    ``forward(input_ids int64 [T], positions int64 [T], kv_caches (unused), attn_metadata,
    token_type_ids int64 [T] | None)`` -> final hidden states [T, hidden_size] in the model dtype
    (after the last layer's LayerNorm).
    """

    attn_type = "encoder_only"  # bidirectional: whole prompts, no KV cache (kvserve.model.registry)
    default_pooling_type = "CLS"
    checkpoint_renames: tuple[tuple[str, str], ...] = (("LayerNorm.gamma", "LayerNorm.weight"),
                                                       ("LayerNorm.beta", "LayerNorm.bias"))
    checkpoint_ignored: tuple[str, ...] = ("pooler.", "embeddings.position_ids", "embeddings.token_type_ids")
    split_checkpoint_tensor = None
    uses_token_type_ids = True  # a pair's segment ids reach the embeddings (kvserve.pooling.score_inputs)

    def __init__(self, arch: ModelArchConfig, attn_backend: AttentionBackend | None = None):
        super().__init__()
        self.arch = arch
        eps = float(arch.raw.get("layer_norm_eps", 1e-12))
        self.embeddings = BertEmbeddings(arch, self.position_offset(arch))
        self.encoder = BertEncoder(arch, eps)

    @classmethod
    def position_offset(cls, arch: ModelArchConfig) -> int:
        """The row of position 0 in ``position_embeddings`` (0 for BERT)."""
        return 0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embeddings(input_ids, positions, token_type_ids)
        for layer in self.encoder.layer:
            hidden = layer(hidden, attn_metadata)
        return hidden


class XLMRobertaModel(BertModel):
    """XLM-RoBERTa / RoBERTa: BERT's network, positions offset by ``pad_token_id + 1`` (module
    docstring), one token type. Pooling: CLS by default, as vLLM's ``RobertaEmbeddingModel``."""

    checkpoint_ignored = BertModel.checkpoint_ignored + ("lm_head.",)
    uses_token_type_ids = False  # one segment type (type_vocab_size 1); pairs are <s> A </s></s> B </s>

    @classmethod
    def position_offset(cls, arch: ModelArchConfig) -> int:
        return int(arch.raw.get("pad_token_id", 1)) + 1


class RobertaModel(XLMRobertaModel):
    """RoBERTa (the same network as XLM-RoBERTa)."""
