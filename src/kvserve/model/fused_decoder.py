"""``FusedDecoder``: a Llama-family model's decoder layers run by one C++ call per step
(``kvserve/kernels/csrc/decoder.cpp``) instead of ~15 Python module calls per layer.

At batch 1 a small model's step is short enough that the Python between the kernels is a large
part of it: on the Qwen2.5-0.5B shape about 100 us per layer, 2.4 ms of an 18 ms int4 step, while
the kernel worker threads wait (docs/benchmarks.md, sections 3.8 and 3.6). The C++ loop calls the same
kernels with the same arguments in the same order as the modules of ``kvserve.model.llama``, so
its hidden states have the modules' bits exactly, whatever the batch.

It covers what the CPU kernels cover, and ``FusedDecoder.build`` returns None otherwise (the
runner then calls the modules): a ``LlamaForCausalLM`` (Mistral, Qwen2, Qwen3) on the CPU in
float32 or bfloat16, every projection an ``InvariantLinear``, a ``QuantizedLinear`` on its kernels
or a ``StackedLinear`` of those (so not with LoRA adapters, tensor parallelism or
``prepack_linears=False``), the ``cpu_paged`` attention backend on shapes its kernel supports and a
KV cache in the model's dtype (one-byte caches quantize their rows in Python). A step whose
queries exceed the backend's ``max_kernel_query_len`` runs on the modules too.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from kvserve.attention.backend import AttentionMetadata
from kvserve.attention.cpu_paged import CpuPagedAttentionBackend
from kvserve.kernels import kernels_for
from kvserve.model.layers import RMSNorm, SiluAndMul
from kvserve.model.llama import MLP_TILE_ROWS, LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel
from kvserve.model.model_inputs import ModelInputs
from kvserve.model.moe import SparseMoeBlock
from kvserve.model.kernel_parts import linear_parts



class FusedDecoder:
    """``model.model``'s forward (embedding, decoder layers, final norm) with the layers in C++.

    ``__call__(input_ids int64 [T], positions int64 [T], kv_caches, attn_metadata)`` -> hidden
    [T, hidden_size] in the model dtype, as ``LlamaModel.forward``; ``handles(attn_metadata)``
    says whether a step can run here (else call the model).
    """

    def __init__(self, model: LlamaModel, stack, max_kernel_query_len: int):
        self._model = model
        self._stack = stack
        self._max_kernel_query_len = max_kernel_query_len

    @classmethod
    def build(cls, model: nn.Module, kv_caches: list[torch.Tensor]) -> FusedDecoder | None:
        """The fused decoder of ``model`` (a loaded ``LlamaForCausalLM`` whose linears are final:
        after quantization and ``use_invariant_linears``), or None where it does not apply (module
        docstring)."""
        inner = getattr(model, "model", None)
        if not isinstance(model, LlamaForCausalLM) or type(inner) is not LlamaModel:
            return None
        kernels = kernels_for(inner.embed_tokens.weight.device)
        dtype = inner.embed_tokens.weight.dtype
        layers = list(inner.layers)
        if (kernels is None or dtype not in (torch.float32, torch.bfloat16)
                or inner.rotary_emb.rotary_dim != inner.rotary_emb.head_dim
                or not layers or type(inner.norm) is not RMSNorm or inner.norm.weight.dtype != dtype
                or len(kv_caches) != len(layers)
                or any(cache.dtype != dtype for cache in kv_caches)):
            return None
        attn = layers[0].self_attn
        backend = attn.backend
        if (type(backend) is not CpuPagedAttentionBackend
                or not backend.supports(attn.num_heads, attn.num_kv_heads, attn.head_dim, torch.device("cpu"))):
            return None
        stack = kernels.DecoderStack(num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
                                     eps=inner.norm.eps, scale=attn.scale, mlp_tile_rows=MLP_TILE_ROWS,
                                     max_kernel_query_len=backend.max_kernel_query_len,
                                     final_norm=inner.norm.weight.detach(), attention_amx=backend.kernel_amx)
        for layer in layers:
            spec = _layer_spec(layer, attn, inner.norm.eps, dtype, kernels)
            if spec is None:
                return None
            stack.add_layer(**spec)
        return cls(inner, stack, backend.max_kernel_query_len)

    def handles(self, metadata: AttentionMetadata) -> bool:
        """Whether this step can run here: its queries fit the attention kernel, no autograd."""
        return metadata.max_query_len <= self._max_kernel_query_len and not torch.is_grad_enabled()

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                 metadata: AttentionMetadata) -> torch.Tensor:
        hidden = self._model.embed(input_ids)
        cos, sin = self._model.rotary_emb.cos_sin(positions, hidden.dtype)
        return self._stack.forward(hidden, cos.contiguous(), sin.contiguous(), kv_caches, metadata.block_tables,
                                   metadata.seq_lens_cpu, metadata.query_start_loc_cpu, metadata.slot_mapping)


def model_hidden(model: nn.Module, fused: FusedDecoder | None, inputs: ModelInputs,
                 kv_caches: list[torch.Tensor]) -> torch.Tensor:
    """Hidden states [T, hidden_size] of a step's tokens: through ``fused`` where it handles the
    step, else the model's modules (the same bits); ``inputs.token_type_ids`` go to a model that
    reads them."""
    if fused is not None and fused.handles(inputs.attn_metadata):
        return fused(inputs.input_ids, inputs.positions, kv_caches, inputs.attn_metadata)
    if inputs.token_type_ids is not None:
        return model(inputs.input_ids, inputs.positions, kv_caches, inputs.attn_metadata,
                     token_type_ids=inputs.token_type_ids)
    return model(inputs.input_ids, inputs.positions, kv_caches, inputs.attn_metadata)


def _layer_spec(layer: nn.Module, first: LlamaAttention, eps: float, dtype: torch.dtype,
                kernels: ModuleType) -> dict | None:
    """``DecoderStack.add_layer``'s arguments for one decoder layer, or None when a part of it is
    not what the C++ loop runs (another module type, another shape or epsilon than layer 0's)."""
    attn, mlp = layer.self_attn, layer.mlp
    moe = mlp.kernel_layer(dtype) if type(mlp) is SparseMoeBlock else None
    if (type(layer) is not LlamaDecoderLayer or type(attn) is not LlamaAttention
            or not (moe is not None or (type(mlp) is LlamaMLP and type(mlp.act_fn) is SiluAndMul))
            or layer.residual_multiplier != 1.0 or not attn.use_rope or attn.full_qk_norm
            or attn.softcap or attn.sinks is not None
            or attn.backend is not first.backend
            or (attn.num_heads, attn.num_kv_heads, attn.head_dim) != (first.num_heads, first.num_kv_heads, first.head_dim)):
        return None
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    if attn.q_norm is not None:
        norms += [attn.q_norm, attn.k_norm]
    if any(type(n) is not RMSNorm or n.eps != eps or n.weight.dtype != dtype for n in norms):
        return None
    projections = {"qkv": attn.qkv_proj, "o": attn.o_proj}
    if moe is None:
        projections.update(gate_up=mlp.gate_up_proj, down=mlp.down_proj)
    parts = {name: linear_parts(module, dtype, kernels) for name, module in projections.items()}
    if any(p is None for p in parts.values()):
        return None
    weight = lambda norm: None if norm is None else norm.weight.detach()  # noqa: E731
    return dict(window=attn.sliding_window or 0, input_norm=weight(layer.input_layernorm),
                post_norm=weight(layer.post_attention_layernorm), q_norm=weight(attn.q_norm),
                k_norm=weight(attn.k_norm), moe=moe, **parts)
