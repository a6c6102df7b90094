"""Qwen1.5/Qwen2-MoE and Qwen3-MoE (Qwen team 2024-2025): the Qwen2 and Qwen3 networks with a
mixture of experts on the sparse layers (``decoder_sparse_step``, ``mlp_only_layers``; softmax
routing, ``norm_topk_prob``) and, in Qwen2-MoE, a shared expert behind a sigmoid gate
(``kvserve.model.moe``)."""

from __future__ import annotations

from kvserve.model.qwen2 import Qwen2ForCausalLM
from kvserve.model.qwen3 import Qwen3ForCausalLM


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    """Qwen2 attention (q/k/v biases), the MoE block with its shared expert."""


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3 attention (q/k norms), the MoE block (Qwen3-30B-A3B: 128 experts, top 8)."""
