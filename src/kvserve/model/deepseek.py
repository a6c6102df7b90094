"""DeepSeek-V2 and DeepSeek-V3/R1 (DeepSeek-AI 2024, "DeepSeek-V2"; 2024, "DeepSeek-V3 Technical
Report") on the Llama network's hooks (``kvserve.model.llama``):

- multi-head latent attention (``MlaAttention``; ``kvserve.attention.latent``): each token's
  keys and values come from one compressed latent, which is what the KV cache holds
  (``kv_lora_rank + qk_rope_head_dim`` values per token and layer, ``MlaConfig.cache_width``),
  the queries through a low-rank pair (``q_lora_rank``) or one projection, the rotary part of
  the key shared by all heads, its dimensions paired (0, 1), (2, 3), ... in the checkpoint;
- dense feed-forwards on the first ``first_k_dense_replace`` layers, then the mixture of experts
  (``kvserve.model.moe``): grouped routing (V3: sigmoid scores with ``e_score_correction_bias``,
  ``noaux_tc``; V2: softmax, ``greedy`` or ``group_limited_greedy``), ``routed_scaling_factor``,
  ``n_shared_experts`` shared experts added ungated;
- YaRN with ``mscale_all_dim`` also scaling the softmax (``MlaConfig.softmax_scale``).

Checkpoint names as transformers and the released checkpoints write them::

    self_attn.q_proj | self_attn.q_a_proj, q_a_layernorm, q_b_proj
    self_attn.kv_a_proj_with_mqa [L + R, hidden], kv_a_layernorm [L], kv_b_proj [H (nope + v), L]
    self_attn.o_proj [hidden, H v]
    mlp.gate.weight, mlp.gate.e_score_correction_bias (V3), mlp.experts.{e}.*, mlp.shared_experts.*

Not here: DeepSeek-V3's multi-token-prediction layer (``num_nextn_predict_layers``; the released
file's ``model.layers.61``, skipped as transformers skips it) and its FP8 block-quantized release
format (refused by name at load: ``kvserve.checkpoint_quantization``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.attention.latent import latent_attention
from kvserve.model.arch_config import MlaConfig, ModelArchConfig
from kvserve.model.kernel_layer import KernelLayer
from kvserve.model.layers import RMSNorm, RotaryEmbedding
from kvserve.model.llama import AttentionOptions, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class LatentUpProjection(KernelLayer):
    """``kv_b_proj``: weight [H * (nope + v), L], per head h the rows of its key part W_k[h]
    [nope, L] then of its value part W_v[h] [v, L]. Used in absorbed form only (never on the
    cached rows), so it is not an ``nn.Linear``: the linear swaps and ``--quantization`` leave it
    as loaded. On the CPU each head's two products run on the batch-invariant GEMM (the float32
    activations against the weight in its dtype, packed once)."""

    def __init__(self, mla: MlaConfig, num_heads: int):
        super().__init__()
        self.num_heads, self.nope, self.v = num_heads, mla.qk_nope_head_dim, mla.v_head_dim
        self.weight = nn.Parameter(torch.empty(num_heads * (self.nope + self.v), mla.kv_lora_rank),
                                   requires_grad=False)
        self._packed: tuple | None = None  # (weight data pointer, per-head absorb panels, value panels)

    def _heads(self) -> torch.Tensor:
        return self.weight.view(self.num_heads, self.nope + self.v, -1)  # [H, nope + v, L]

    def _kernel_panels(self, kernels) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        if self._packed is None or self._packed[0] != self.weight.data_ptr():
            heads = self._heads().detach()
            absorb = [kernels.pack_linear_weight(h[: self.nope].t().contiguous()) for h in heads]  # [L, nope]
            values = [kernels.pack_linear_weight(h[self.nope :].contiguous()) for h in heads]  # [v, L]
            self._packed = (self.weight.data_ptr(), absorb, values)
        return self._packed[1], self._packed[2]

    def absorb_query(self, q_nope: torch.Tensor) -> torch.Tensor:
        """q_nope [T, H, nope] -> float32 [T, H, L]: ``W_k[h]^T q_nope_h`` per head."""
        kernels = self.ops
        if kernels is None:
            return torch.einsum("thn,hnl->thl", q_nope.float(), self._heads()[:, : self.nope].float())
        absorb, _ = self._kernel_panels(kernels)
        latent = self.weight.shape[1]
        x = q_nope.float()
        return torch.stack([kernels.invariant_linear(x[:, h].contiguous(), absorb[h], None, latent)
                            for h in range(self.num_heads)], dim=1)

    def project_values(self, latent_out: torch.Tensor) -> torch.Tensor:
        """float32 [T, H, L] -> float32 [T, H, v]: ``W_v[h] out_h`` per head."""
        kernels = self.ops
        if kernels is None:
            return torch.einsum("thl,hvl->thv", latent_out, self._heads()[:, self.nope :].float())
        _, values = self._kernel_panels(kernels)
        return torch.stack([kernels.invariant_linear(latent_out[:, h].contiguous(), values[h], None, self.v)
                            for h in range(self.num_heads)], dim=1)


class MlaAttention(KernelLayer):
    """Multi-head latent attention: hidden [T, hidden_size] -> [T, hidden_size]; writes this
    layer's latent rows into ``kv_cache`` ([1, num_blocks, block_size, 1, cache_width])."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend, options: AttentionOptions):
        super().__init__()
        mla = arch.mla
        self.mla = mla
        self.num_heads = arch.num_attention_heads
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank is None:
            self.q_proj = nn.Linear(arch.hidden_size, self.num_heads * qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(arch.hidden_size, mla.q_lora_rank, bias=arch.attention_bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank)  # eps 1e-6, whatever rms_norm_eps says (as transformers)
            self.q_b_proj = nn.Linear(mla.q_lora_rank, self.num_heads * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(arch.hidden_size, mla.cache_width, bias=arch.attention_bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank)
        self.kv_b_proj = LatentUpProjection(mla, self.num_heads)
        self.o_proj = nn.Linear(self.num_heads * mla.v_head_dim, arch.hidden_size, bias=arch.attention_bias)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        mla, tokens = self.mla, hidden.shape[0]
        if mla.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q_nope, q_rope = q.view(tokens, self.num_heads, -1).split([mla.qk_nope_head_dim, mla.qk_rope_head_dim], -1)
        latent, k_rope = self.kv_a_proj_with_mqa(hidden).split([mla.kv_lora_rank, mla.qk_rope_head_dim], -1)
        latent = self.kv_a_layernorm(latent.contiguous())
        q_rope, k_rope = self._rotate(q_rope, cos, sin), self._rotate(k_rope[:, None, :], cos, sin)[:, 0]
        query = torch.cat([self.kv_b_proj.absorb_query(q_nope), q_rope.float()], dim=-1)
        out = latent_attention(query, torch.cat([latent, k_rope], dim=-1), kv_cache, attn_metadata,
                               scale=mla.softmax_scale, value_width=mla.kv_lora_rank, ops=self.ops)
        values = self.kv_b_proj.project_values(out).to(hidden.dtype)
        return self.o_proj(values.reshape(tokens, -1))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of x [T, heads, rope] in the model dtype: interleaved pairs first laid
        out as halves (the same values transformers' interleaved rotation gives, in its order;
        queries and keys alike, so their products are unchanged); in float32, rounded once, where
        ``rope_float32`` (V2's complex product)."""
        if self.mla.interleaved_rope:
            x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
        if self.mla.rope_float32:
            return RotaryEmbedding.apply(x.float(), cos.float(), sin.float(), self.ops).to(x.dtype)
        return RotaryEmbedding.apply(x.contiguous(), cos, sin, self.ops)


class MlaDecoderLayer(LlamaDecoderLayer):
    """The pre-norm block with ``MlaAttention``."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend, options: AttentionOptions,
                 mlp: nn.Module, residual_multiplier: float = 1.0):
        super().__init__(arch, layer_idx, backend, options, mlp, residual_multiplier)
        self.self_attn = MlaAttention(arch, layer_idx, backend, options)


class MlaModel(LlamaModel):
    """The embedding, ``MlaDecoderLayer``s and the final norm; cos and sin in float32 where the
    attention rotates in float32 (V2)."""

    def rope_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float32 if self.layers[0].self_attn.mla.rope_float32 else dtype


class DeepseekV3ForCausalLM(LlamaForCausalLM):
    """DeepSeek-V3 / R1 (module docstring)."""

    checkpoint_renames = ((".mlp.shared_experts.", ".mlp.shared_expert."),
                          (".mlp.gate.e_score_correction_bias", ".mlp.score_correction.value"))
    checkpoint_ignored = ("model.layers.61.",)  # V3's multi-token-prediction layer (transformers skips it too)
    layer_class = MlaDecoderLayer
    model_class = MlaModel

    @classmethod
    def split_checkpoint_tensor(cls, name: str, load: Callable[[], torch.Tensor]) -> list[tuple[str, torch.Tensor]] | None:
        """Shared-expert tensors of no elements (``n_shared_experts: 0``, as transformers saves
        them) hold nothing; every other tensor is one parameter."""
        if ".mlp.shared_expert." not in name:
            return None
        tensor = load()
        return [] if tensor.numel() == 0 else [(name, tensor)]


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V2 / V2-Lite / V2.5 (module docstring)."""

    checkpoint_ignored = ()
