"""GPT-OSS (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card") on the Llama network's hooks
(``kvserve.model.llama``):

- attention with q/k/v/o biases and a learned sink logit per query head (``self_attn.sinks``: it
  joins every row's softmax denominator, ``kvserve.attention``); sliding-window (128) and full
  layers alternating from layer 0 (``layer_types``); YaRN rope (``kvserve.model.layers``);
- RMSNorm with the weight applied in float32 (``UpcastRMSNorm``);
- a mixture of experts in every layer (``kvserve.model.moe``): the router with a bias, the top k
  logits then a softmax over them, experts with biases and the clamped SwiGLU gate.

The checkpoint stores all experts of a layer in one tensor per projection, transposed against a
linear's weight and with the gate and up columns interleaved::

    mlp.experts.gate_up_proj       [E, hidden, 2 * I]   columns 2j: gate j, 2j + 1: up j
    mlp.experts.gate_up_proj_bias  [E, 2 * I]           the same interleaving
    mlp.experts.down_proj          [E, I, hidden]
    mlp.experts.down_proj_bias     [E, hidden]

The released checkpoints store the two weights in MXFP4 (``quantization_config.quant_method``
``mxfp4``; ``kvserve.model.quant_tensor.from_mxfp4``), rows as a linear's (outputs), gate and up
rows interleaved::

    mlp.experts.gate_up_proj_blocks  uint8 [E, 2 * I, hidden / 32, 16]
    mlp.experts.gate_up_proj_scales  uint8 [E, 2 * I, hidden / 32]
    mlp.experts.down_proj_blocks     uint8 [E, hidden, I / 32, 16]
    mlp.experts.down_proj_scales     uint8 [E, hidden, I / 32]

``split_checkpoint_tensor`` cuts them into each expert's ``gate_up_proj`` ([gate | up] rows) and
``down_proj`` weights (or MXFP4 blocks and scales, which become 4-bit ``QuantizedLinear``s) and
biases; ``mlp.router`` is the block's ``gate``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.layers import UpcastRMSNorm
from kvserve.model.llama import AttentionOptions, LlamaForCausalLM

_FUSED = {"gate_up_proj": "gate_up_proj.weight", "gate_up_proj_bias": "gate_up_bias",
          "down_proj": "down_proj.weight", "down_proj_bias": "down_bias",
          "gate_up_proj_blocks": "gate_up_proj.blocks", "gate_up_proj_scales": "gate_up_proj.scales",
          "down_proj_blocks": "down_proj.blocks", "down_proj_scales": "down_proj.scales"}


def _uninterleaved(x: torch.Tensor) -> torch.Tensor:
    """Rows (or values) 0, 2, 4, ... then 1, 3, 5, ...: interleaved gate/up as [gate | up]."""
    return torch.cat([x[0::2], x[1::2]])


class GptOssForCausalLM(LlamaForCausalLM):
    """GPT-OSS 20B / 120B (module docstring)."""

    checkpoint_renames = ((".mlp.router.", ".mlp.gate."),)

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=arch.attention_bias, o_bias=arch.attention_bias, qk_norm=False, sinks=True,
                                norm_class=UpcastRMSNorm)

    @classmethod
    def split_checkpoint_tensor(cls, name: str, load: Callable[[], torch.Tensor]) -> list[tuple[str, torch.Tensor]] | None:
        prefix, _, kind = name.rpartition(".")
        if not prefix.endswith(".mlp.experts") or kind not in _FUSED:
            return None
        tensor = load()
        pieces = []
        for e in range(tensor.shape[0]):
            part = tensor[e]
            if kind in ("gate_up_proj", "down_proj"):
                part = part.t()
            if kind.startswith("gate_up"):
                part = _uninterleaved(part)
            pieces.append((f"{prefix}.{e}.{_FUSED[kind]}", part))
        return pieces
