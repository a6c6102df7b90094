"""Tensor names between Hugging Face checkpoints and GGUF files, and llama.cpp's q/k row order.

Names (llama.cpp's ``gguf.constants.TENSOR_NAMES`` for the llama/qwen2/qwen3 architectures)::

    model.embed_tokens.weight                   token_embd.weight
    model.norm.weight                           output_norm.weight
    lm_head.weight                              output.weight (absent when tied)
    model.layers.N.input_layernorm.weight       blk.N.attn_norm.weight
    model.layers.N.post_attention_layernorm.*   blk.N.ffn_norm.*
    model.layers.N.self_attn.{q,k,v,o}_proj.*   blk.N.attn_{q,k,v,output}.*
    model.layers.N.self_attn.{q,k}_norm.*       blk.N.attn_{q,k}_norm.*      (Qwen3)
    model.layers.N.mlp.{gate,up,down}_proj.*    blk.N.ffn_{gate,up,down}.*

Rotary layout: Hugging Face Llama checkpoints rotate the two halves of each head ("rotate half");
llama.cpp's ``llama`` architecture rotates adjacent pairs, so its converter permutes the rows of
q_proj and k_proj within each head: GGUF row ``(h, i, j)`` = HF row ``(h, j, i)`` for ``i <
head_dim / 2``, ``j < 2`` (transformers' GGUF loader undoes it the same way). ``qwen2`` and
``qwen3`` files use the NeoX (rotate-half) layout and are not permuted.
"""

from __future__ import annotations

import numpy as np

_FIXED = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
PERMUTED_ARCHITECTURES = ("llama",)


def gguf_name(hf_name: str) -> str:
    """The GGUF name of a Hugging Face tensor (or module) name; a trailing ``.weight`` /
    ``.bias`` is kept.

    Raises:
        KeyError: a name with no GGUF counterpart (the message names it).
    """
    module, dot, kind = hf_name.rpartition(".")
    if kind not in ("weight", "bias"):
        module, dot, kind = hf_name, "", ""
    if module in _FIXED:
        return _FIXED[module] + dot + kind
    parts = module.split(".")
    if parts[:2] == ["model", "layers"] and len(parts) > 3 and ".".join(parts[3:]) in _LAYER:
        return f"blk.{parts[2]}.{_LAYER['.'.join(parts[3:])]}" + dot + kind
    raise KeyError(f"no GGUF name for tensor {hf_name!r}")


def llama_rotary_order(rows: int, heads: int) -> np.ndarray:
    """int64 [rows]: ``gguf_rows = hf_rows[order]`` for a q (``heads`` = attention heads) or k
    (``heads`` = KV heads) projection of ``rows = heads * head_dim`` rows; ``np.argsort(order)``
    undoes it."""
    half = rows // heads // 2
    return np.arange(rows, dtype=np.int64).reshape(heads, 2, half).swapaxes(1, 2).reshape(rows)
