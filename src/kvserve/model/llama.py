"""Llama-family decoder (Touvron et al. 2023, "LLaMA"; Meta's Llama 3), written for the paged
runtime: a flat batch of tokens in, attention through an ``AttentionBackend`` and the paged KV
cache. Mistral is the same network with a sliding window; Qwen2/Qwen3 subclass it
(``kvserve.model.qwen2``, ``kvserve.model.qwen3``).

Parameter names mirror Hugging Face's, except the fused projections::

    model.layers.{i}.self_attn.qkv_proj    = rows [q_proj | k_proj | v_proj]
    model.layers.{i}.mlp.gate_up_proj      = rows [gate_proj | up_proj]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.kernel_layer import KernelLayer
from kvserve.model.layers import ACTIVATIONS, MergedLinear, RMSNorm, RotaryEmbedding
from kvserve.model.meta_init import embedding
from kvserve.model.moe import SparseMoeBlock


@dataclass(frozen=True)
class AttentionOptions:
    """Per-architecture attention variants.

    Attributes:
        qkv_bias, o_bias: biases on q/k/v and on o_proj.
        qk_norm: RMSNorm of the queries and keys before the rotary embedding: per head over
            head_dim (True: Qwen3), or ``"full"`` over all heads at once (OLMo 2).
        scale: the softmax scale (None: head_dim ** -0.5; Granite's ``attention_multiplier``).
        no_rope_layers: layers whose queries and keys are not rotated (SmolLM3's NoPE layers).
        norm_class: the class of every RMSNorm of the model, the q/k norms, the layers' and the
            final one (``RMSNorm``; ``UpcastRMSNorm``: GPT-OSS; ``GemmaRMSNorm``: Gemma).
        softcap: > 0 caps the scaled scores at ``softcap * tanh(s / softcap)`` (Gemma 2's
            ``attn_logit_softcapping``).
        sinks: a learned sink logit per query head (``self_attn.sinks``; GPT-OSS).
    """

    qkv_bias: bool
    o_bias: bool
    qk_norm: bool | str
    scale: float | None = None
    no_rope_layers: frozenset[int] = frozenset()
    norm_class: type[nn.Module] = RMSNorm
    softcap: float = 0.0
    sinks: bool = False


@dataclass(frozen=True)
class ModelOptions:
    """Per-architecture multipliers outside the attention (Granite): the embedding times
    ``embedding_multiplier``, each layer's attention and MLP outputs times ``residual_multiplier``
    before their residual add, the logits divided by ``logits_divisor``. Each product is one
    operation in the model dtype, as transformers' ``x * m``. ``logit_softcap`` > 0 caps the
    logits at ``cap * tanh(logits / cap)`` (Gemma 2's ``final_logit_softcapping``)."""

    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_divisor: float = 1.0
    logit_softcap: float = 0.0


class LlamaAttention(KernelLayer):
    """Multi-head attention with grouped-query KV heads (Ainslie et al. 2023, "GQA").

    forward: hidden [T, hidden_size] -> [T, hidden_size]; writes this layer's K/V into
    ``kv_cache`` ([2, num_blocks, block_size, num_kv_heads, head_dim]) through the backend.
    """

    triton_kernels = True  # its ops run the rotary embedding only

    def __init__(
        self,
        arch: ModelArchConfig,
        layer_idx: int,
        backend: AttentionBackend,
        options: AttentionOptions,
    ):
        super().__init__()
        self.num_heads = arch.num_attention_heads
        self.num_kv_heads = arch.num_key_value_heads
        self.head_dim = arch.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5 if options.scale is None else options.scale
        self.use_rope = layer_idx not in options.no_rope_layers
        self.sliding_window = arch.layer_sliding_windows[layer_idx]
        self.backend = backend
        self.qkv_proj = MergedLinear(
            arch.hidden_size,
            [self.q_size, self.kv_size, self.kv_size],
            ["q_proj", "k_proj", "v_proj"],
            bias=options.qkv_bias,
        )
        self.o_proj = nn.Linear(self.q_size, arch.hidden_size, bias=options.o_bias)
        self.softcap = options.softcap
        self.sinks = nn.Parameter(torch.zeros(self.num_heads)) if options.sinks else None
        self.full_qk_norm = options.qk_norm == "full"
        if options.qk_norm:
            q_width, k_width = (self.q_size, self.kv_size) if self.full_qk_norm else (self.head_dim, self.head_dim)
            self.q_norm = options.norm_class(q_width, arch.rms_norm_eps)
            self.k_norm = options.norm_class(k_width, arch.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.full_qk_norm:
            q, k = self.q_norm(q.contiguous()), self.k_norm(k.contiguous())
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and not self.full_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            q = RotaryEmbedding.apply(q, cos, sin, self.ops)
            k = RotaryEmbedding.apply(k, cos, sin, self.ops)
        out = self.backend.forward(q, k, v, kv_cache, attn_metadata, scale=self.scale,
                                   sliding_window=self.sliding_window, softcap=self.softcap, sinks=self.sinks)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


# Rows per MLP pass on the CPU. The [T, 2 * intermediate] activation of a long prefill step
# outgrows the last-level cache (2,048 rows of the Qwen2.5-0.5B shape: 40 MB against 32 MB of
# L3) and the matmuls slow down; in 512-row tiles the same MLP was 15% faster (72.6 -> 62.0 ms at
# 2,048 rows, same run, docs/benchmarks.md section 3.9; with the invariant GEMM of
# kvserve.model.invariant_linear, 1.11x bf16 / 1.16x float32 at one thread,
# benchmarks/bench_linear.py --mlp). Each row's result does not depend on the tiling (rows of a
# linear are computed independently).
MLP_TILE_ROWS = 512


class LlamaMLP(nn.Module):
    """Gated feed-forward: ``down(act(gate(x)) * up(x))``, [T, hidden] -> [T, hidden], SwiGLU
    (``act`` = SiLU) or GeGLU (Gemma's tanh GELU) as config.json's activation says; on the CPU in
    tiles of ``MLP_TILE_ROWS`` rows."""

    def __init__(self, arch: ModelArchConfig):
        super().__init__()
        size = arch.intermediate_size
        self.gate_up_proj = MergedLinear(
            arch.hidden_size, [size, size], ["gate_proj", "up_proj"], bias=arch.mlp_bias
        )
        self.act_fn = ACTIVATIONS[arch.hidden_act]()
        self.down_proj = nn.Linear(size, arch.hidden_size, bias=arch.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.shape[0] > MLP_TILE_ROWS:
            return torch.cat([self._swiglu(tile) for tile in x.split(MLP_TILE_ROWS)])
        return self._swiglu(x)

    def _swiglu(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))`` (residual adds in model dtype,
    as transformers does).

    forward(hidden, residual, ...) -> (mlp_out, residual): the layer's input is ``hidden +
    residual`` (``residual`` None: ``hidden`` alone) and its output ``mlp_out + residual``; each
    sum is formed inside the following norm (``RMSNorm.add_and_norm``, one pass on the CPU)."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend, options: AttentionOptions,
                 mlp: nn.Module, residual_multiplier: float = 1.0):
        super().__init__()
        self.self_attn = LlamaAttention(arch, layer_idx, backend, options)
        self.mlp = mlp
        self.input_layernorm = options.norm_class(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = options.norm_class(arch.hidden_size, arch.rms_norm_eps)
        self.residual_multiplier = residual_multiplier

    def forward(self, hidden, residual, cos, sin, kv_cache, attn_metadata):
        if residual is None:
            normed, residual = self.input_layernorm(hidden), hidden
        else:
            normed, residual = self.input_layernorm.add_and_norm(hidden, residual)
        attn = self.self_attn(normed, cos, sin, kv_cache, attn_metadata)
        normed, residual = self.post_attention_layernorm.add_and_norm(self._scaled(attn), residual)
        return self._scaled(self.mlp(normed)), residual

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        """A sublayer's output as it joins the residual (times Granite's ``residual_multiplier``)."""
        return x if self.residual_multiplier == 1.0 else x * self.residual_multiplier


class PostNormDecoderLayer(nn.Module):
    """OLMo 2's block (Groeneveld et al. 2024; OLMo 2 2025): the norms after the sublayers,
    ``h = h + norm(attn(h)); h = h + norm(mlp(h))``, and none before them. forward as
    ``LlamaDecoderLayer``'s, with the residual always folded in (it returns ``(h, None)``)."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend, options: AttentionOptions,
                 mlp: nn.Module, residual_multiplier: float = 1.0):
        super().__init__()
        self.self_attn = LlamaAttention(arch, layer_idx, backend, options)
        self.mlp = mlp
        self.post_attention_layernorm = options.norm_class(arch.hidden_size, arch.rms_norm_eps)
        self.post_feedforward_layernorm = options.norm_class(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, hidden, residual, cos, sin, kv_cache, attn_metadata):
        hidden = hidden + self.post_attention_layernorm(self.self_attn(hidden, cos, sin, kv_cache, attn_metadata))
        return hidden + self.post_feedforward_layernorm(self.mlp(hidden)), None


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm: token ids [T] -> hidden [T, hidden_size]."""

    def __init__(self, arch: ModelArchConfig, backend: AttentionBackend, options: AttentionOptions,
                 build_mlp: Callable[[ModelArchConfig, int], nn.Module], layer_class: type[nn.Module] = None,
                 model_options: ModelOptions = ModelOptions()):
        super().__init__()
        layer_class = layer_class or LlamaDecoderLayer
        self.embed_tokens = embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(
            layer_class(arch, i, backend, options, build_mlp(arch, i), model_options.residual_multiplier)
            for i in range(arch.num_hidden_layers)
        )
        self.norm = options.norm_class(arch.hidden_size, arch.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling, arch.rotary_dim)
        self.embedding_multiplier = model_options.embedding_multiplier

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings [T, hidden] (times ``embedding_multiplier``, Granite's)."""
        hidden = self.embed_tokens(input_ids)
        return hidden if self.embedding_multiplier == 1.0 else hidden * self.embedding_multiplier

    def rope_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype of the cos and sin the layers get, for hidden states of ``dtype``: the same."""
        return dtype

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        hidden = self.embed(input_ids)
        cos, sin = self.rotary_emb.cos_sin(positions, self.rope_dtype(hidden.dtype))
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache, attn_metadata)
        return self.norm(hidden) if residual is None else self.norm.add_and_norm(hidden, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Causal LM head over ``LlamaModel``; the attention backend is given at construction.

    ``forward(input_ids: int64 [T], positions: int64 [T], kv_caches: list of
    [2, num_blocks, block_size, num_kv_heads, head_dim] (one per layer), attn_metadata)``
    -> hidden states [T, hidden_size] in the model dtype. ``compute_logits(hidden [N, hidden])``
    -> [N, vocab_size] in the model dtype (transformers upcasts this product to float32; the
    sampler upcasts where it needs to, and greedy argmax reads it as is, the same choice).

    The per-family hooks: ``attention_options`` (q/k/v and o biases, q/k norms, the softmax scale,
    layers without RoPE), ``model_options`` (Granite's multipliers), ``build_mlp`` (a layer's
    feed-forward: SwiGLU, or a mixture of experts), ``layer_class`` (where the norms sit:
    ``LlamaDecoderLayer`` before the sublayers, ``PostNormDecoderLayer`` after them),
    ``model_class`` (the embedding, layers and final norm: ``LlamaModel``, or Gemma's),
    ``checkpoint_renames`` (substrings of the checkpoint's tensor names replaced by this module's
    before loading), ``checkpoint_ignored`` (prefixes of tensors this text model does not
    load: a multimodal checkpoint's vision tower) and ``split_checkpoint_tensor`` (a tensor that
    holds several parameters).
    """

    checkpoint_renames: tuple[tuple[str, str], ...] = ()
    checkpoint_ignored: tuple[str, ...] = ()
    layer_class: type[nn.Module] = LlamaDecoderLayer
    model_class: type[nn.Module] = LlamaModel

    def __init__(self, arch: ModelArchConfig, attn_backend: AttentionBackend):
        super().__init__()
        self.arch = arch
        self.options = self.model_options(arch)
        self.model = self.model_class(arch, attn_backend, self.attention_options(arch), self.build_mlp,
                                      self.layer_class, self.options)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def split_checkpoint_tensor(cls, name: str, load: Callable[[], torch.Tensor]) -> list[tuple[str, torch.Tensor]] | None:
        """The (parameter name, tensor) pairs one checkpoint tensor (named as this module names
        it, after ``checkpoint_renames``; ``load()`` reads it) holds, for a family that stores
        several parameters in one (GPT-OSS's experts), or None: the tensor is one parameter."""
        return None

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=arch.attention_bias, o_bias=arch.attention_bias, qk_norm=False)

    @classmethod
    def model_options(cls, arch: ModelArchConfig) -> ModelOptions:
        return ModelOptions()

    @classmethod
    def build_mlp(cls, arch: ModelArchConfig, layer_idx: int) -> nn.Module:
        """Layer ``layer_idx``'s feed-forward: the MoE block on a config's sparse layers, else
        SwiGLU."""
        if arch.moe is not None and layer_idx in arch.moe.sparse_layers:
            return SparseMoeBlock(arch, arch.moe)
        return LlamaMLP(arch)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden_states)
        if self.options.logits_divisor != 1.0:
            logits = logits / self.options.logits_divisor
        if self.options.logit_softcap:
            logits = torch.tanh(logits / self.options.logit_softcap) * self.options.logit_softcap
        return logits


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral 7B (Jiang et al. 2023): Llama with sliding-window attention (``sliding_window``
    in config.json, applied to every layer)."""


class MixtralForCausalLM(LlamaForCausalLM):
    """Mixtral 8x7B / 8x22B (Jiang et al. 2024, "Mixtral of Experts"): Mistral's attention with a
    mixture of experts in every layer (top 2 of 8, softmax then renormalised; ``kvserve.model.moe``).
    The checkpoint's ``block_sparse_moe.experts.{e}.w1/w3/w2`` are gate/up/down."""

    checkpoint_renames = ((".block_sparse_moe.", ".mlp."), (".w1.", ".gate_proj."), (".w3.", ".up_proj."),
                          (".w2.", ".down_proj."))
