"""A Llama-family model's decoder layers in one call (``csrc/decoder.cpp``): ``LinearPart`` and
``DecoderStack`` as ``kvserve.model.fused_decoder`` builds them."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from kvserve.kernels.tensors import code, optional_ptr, ptr, require

KINDS = range(4)  # decoder.cpp's LinearKind: vector, AMX, quantized vector, quantized AMX


class LinearPart(ctypes.Structure):
    """One linear layer's packed weight and the kernel that reads it (``decoder.cpp``'s struct)."""

    _fields_ = [("kind", ctypes.c_int64), ("packed", ctypes.c_void_p), ("weight_dtype", ctypes.c_int64),
                ("scales", ctypes.c_void_p), ("neg_offsets", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("input_perm", ctypes.c_void_p), ("in_features", ctypes.c_int64), ("out_features", ctypes.c_int64),
                ("group_size", ctypes.c_int64), ("bits", ctypes.c_int64), ("codebook", ctypes.c_int64)]

    def __init__(self, kind: int, packed: torch.Tensor, scales: torch.Tensor | None, neg_offsets: torch.Tensor | None,
                 bias: torch.Tensor | None, input_perm: torch.Tensor | None, in_features: int, out_features: int,
                 group_size: int, bits: int, codebook: int = 0):
        require(kind in KINDS, f"LinearPart: unknown kind {kind}")
        require(kind < 2 or scales is not None, "LinearPart: a quantized kind needs scales")
        if input_perm is not None:
            input_perm = input_perm.to(torch.int64).contiguous()
        super().__init__(kind, ptr(packed), code(packed.dtype) if packed.is_floating_point() else 0,
                         optional_ptr(scales), optional_ptr(neg_offsets), optional_ptr(bias), optional_ptr(input_perm),
                         in_features, out_features, group_size, bits, codebook)
        # The C++ side holds raw pointers: the tensors live as long as this part.
        self.tensors = [t for t in (packed, scales, neg_offsets, bias, input_perm) if t is not None]


class DecoderStack:
    """The decoder layers of one model in C++; ``forward`` runs them all without the GIL.

    Holds references to every tensor it was given (the C++ stack reads them in place)."""

    def __init__(self, lib, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, scale: float,
                 mlp_tile_rows: int, max_kernel_query_len: int, final_norm: torch.Tensor, attention_amx: int = -1):
        require(final_norm.dtype in (torch.float32, torch.bfloat16) and final_norm.is_contiguous(),
                "DecoderStack: a contiguous float32 or bfloat16 final norm")
        self._lib = lib
        self.dtype, self.hidden_size = final_norm.dtype, final_norm.numel()
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self._tensors: list = [final_norm]
        handle = ctypes.c_void_p()
        lib.call("kvserve_decoder_create", code(self.dtype), self.hidden_size, num_heads, num_kv_heads, head_dim, eps,
                 scale, mlp_tile_rows, max_kernel_query_len, ptr(final_norm), attention_amx, ctypes.byref(handle))
        self._handle = handle
        self._num_layers = 0
        self._caches: tuple[tuple[int, ...], ctypes.Array] | None = None

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            self._lib.decoder_destroy(handle)

    def add_layer(self, window: int, input_norm: torch.Tensor, post_norm: torch.Tensor, q_norm: torch.Tensor | None,
                  k_norm: torch.Tensor | None, qkv: Sequence[LinearPart], o: Sequence[LinearPart],
                  gate_up: Sequence[LinearPart] = (), down: Sequence[LinearPart] = (),
                  moe=None) -> None:
        """One layer; its MLP is ``gate_up``/``down`` (SwiGLU) or the mixture of experts ``moe``
        (a ``kvserve.kernels.ops_moe.MoeLayer``)."""
        norms = [n for n in (input_norm, post_norm, q_norm, k_norm) if n is not None]
        require(all(n.dtype == self.dtype and n.is_contiguous() for n in norms),
                "DecoderStack.add_layer: contiguous norms in the stack's dtype")
        require((moe is None) == bool(gate_up and down), "DecoderStack.add_layer: an MLP (gate_up and down) or an MoE layer")
        parts = [*qkv, *o, *gate_up, *down]
        array = (LinearPart * len(parts))(*parts)
        counts = (ctypes.c_int64 * 4)(len(qkv), len(o), len(gate_up), len(down))
        self._lib.call("kvserve_decoder_add_layer", self._handle, window, ptr(input_norm), ptr(post_norm),
                       optional_ptr(q_norm), optional_ptr(k_norm), array, counts, None if moe is None else moe.handle)
        self._tensors += [norms, parts, moe]
        self._num_layers += 1

    def _cache_array(self, kv_caches: Sequence[torch.Tensor]) -> ctypes.Array:
        """The caches' pointers as a C array, made again only when the caches change."""
        pointers = tuple(c.data_ptr() for c in kv_caches)
        if self._caches is None or self._caches[0] != pointers:
            self._caches = (pointers, (ctypes.c_void_p * len(pointers))(*pointers))
        return self._caches[1]

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_caches: Sequence[torch.Tensor],
                block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                slot_mapping: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] of the embedding -> the final norm's output [T, H] (the stack's dtype)."""
        require(hidden.dim() == 2 and hidden.is_contiguous() and hidden.dtype == self.dtype
                and hidden.shape[1] == self.hidden_size, "DecoderStack: hidden [T, hidden_size] in the stack's dtype")
        require(slot_mapping.dtype == torch.int64 and block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32
                and query_start_loc.dtype == torch.int32, "DecoderStack: int64 slots, int32 attention metadata")
        tokens = hidden.shape[0]
        require(cos.dtype == self.dtype and sin.dtype == self.dtype and cos.is_contiguous() and sin.is_contiguous()
                and tuple(cos.shape) == tuple(sin.shape) == (tokens, self.head_dim),
                "DecoderStack: cos and sin [T, head_dim] contiguous in the stack's dtype")
        require(bool(kv_caches) and all(c.dtype == self.dtype and c.is_contiguous() and c.dim() == 5
                                        and c.shape == kv_caches[0].shape and c.shape[0] == 2
                                        and tuple(c.shape[3:]) == (self.num_kv_heads, self.head_dim) for c in kv_caches),
                "DecoderStack: contiguous KV caches [2, num_blocks, block_size, H_kv, head_dim] in the stack's dtype")
        block_tables, seq_lens = block_tables.contiguous(), seq_lens.contiguous()
        query_start_loc, slot_mapping = query_start_loc.contiguous(), slot_mapping.contiguous()
        require(query_start_loc.numel() == seq_lens.numel() + 1 and block_tables.dim() == 2
                and block_tables.shape[0] >= seq_lens.numel() and slot_mapping.numel() == hidden.shape[0],
                "DecoderStack: attention metadata does not match the batch")
        out = torch.empty_like(hidden)
        _, blocks, block_size = kv_caches[0].shape[:3]
        self._lib.call("kvserve_decoder_forward", self._handle, ptr(hidden), ptr(out), hidden.shape[0], ptr(cos),
                       ptr(sin), self._cache_array(kv_caches), len(kv_caches), ptr(block_tables), ptr(seq_lens),
                       ptr(query_start_loc), ptr(slot_mapping), blocks, block_size, seq_lens.numel(),
                       block_tables.shape[1])
        return out

