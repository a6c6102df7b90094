"""The linear kernels: batch-invariant float32/bfloat16 GEMM (``csrc/linear.cpp``), its AMX form
(``amx_linear.cpp``), the int8/int4 weight-only ones (``quant_linear.cpp``,
``amx_quant_linear.cpp``) and LoRA's (``lora.cpp``)."""

from __future__ import annotations

import ctypes

import torch

from kvserve.kernels.tensors import (FLOAT_DTYPES, code, cpu_contiguous, optional_bias, optional_offsets, ptr,
                                     require)

_TILE_N, _TILE_K, _TILE_ROWS = 16, 32, 16  # amx_tiles.h
CODEBOOKS = {"int": 0, "e2m1": 1}  # kernels.h's Codebook: what a 4-bit code stands for


def _check_codebook(codebook: int, bits: int, neg_offsets: torch.Tensor | None) -> None:
    require(codebook in CODEBOOKS.values(), f"codebook must be one of {sorted(CODEBOOKS.values())}")
    require(codebook == 0 or (bits == 4 and neg_offsets is None),
            "the E2M1 codebook is for 4-bit weights without offsets")


def _quant_weight(packed: torch.Tensor, packed_shape: tuple[int, ...], packed_message: str, scales: torch.Tensor,
                  scales_shape: tuple[int, ...], scales_message: str, neg_offsets: torch.Tensor | None, bits: int,
                  bias: torch.Tensor | None, n: int) -> tuple[int | None, int | None]:
    """A quantized layer's packed integers and scales checked against their layout's shapes; the
    offsets' and the bias's pointers (None where absent)."""
    require(packed.dtype == torch.uint8 and packed.is_contiguous() and tuple(packed.shape) == packed_shape,
            packed_message)
    require(scales.is_contiguous() and tuple(scales.shape) == scales_shape and scales.dtype == torch.float32,
            scales_message)
    return optional_offsets(neg_offsets, bits, scales_shape), optional_bias(bias, n)


class LinearOps:
    """The linear kernels' wrappers (shapes and layouts in their C++ files)."""

    def linear_panel_width(self) -> int:
        """Output columns per packed weight panel of ``invariant_linear``."""
        return self._lib.linear_panel_width()

    def pack_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """weight [N, K] float32 or bfloat16 -> its panels [ceil(N / width), K, width] (same dtype)."""
        require(weight.dim() == 2 and weight.device.type == "cpu", "weight must be a 2-D CPU tensor")
        require(weight.dtype in FLOAT_DTYPES, "pack_linear_weight supports float32 and bfloat16")
        weight = weight.contiguous()
        n, k = weight.shape
        width = self.linear_panel_width()
        packed = torch.empty((-(-n // width), k, width), dtype=weight.dtype)
        self._lib.call("kvserve_pack_linear_weight", code(weight.dtype), ptr(weight), ptr(packed), n, k)
        return packed

    def invariant_linear(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                         out_features: int) -> torch.Tensor:
        """x [M, K] float32 or bfloat16 (contiguous) -> x W^T + b [M, N] in x's dtype."""
        cpu_contiguous(x, 2, FLOAT_DTYPES, "x must be a contiguous 2-D float32 or bfloat16 CPU tensor")
        width = self.linear_panel_width()
        require(packed.dim() == 3 and packed.shape[2] == width and packed.is_contiguous()
                and packed.dtype in FLOAT_DTYPES, "packed must come from pack_linear_weight")
        m, k = x.shape
        require(packed.shape[1] == k and packed.shape[0] == -(-out_features // width), "packed weight does not match x / N")
        bias_ptr = optional_bias(bias, out_features)
        out = torch.empty((m, out_features), dtype=x.dtype)
        self._lib.call("kvserve_invariant_linear", code(x.dtype), ptr(x), code(packed.dtype), ptr(packed), bias_ptr,
                       ptr(out), m, k, out_features)
        return out

    def amx_linear_available(self) -> bool:
        """AMX-BF16 tiles usable here: this library is the avx512_bf16 one, the CPU and OS grant the
        tiles, and the user's switch allows them (``KVSERVE_AMX=0``: never;
        :func:`kvserve.kernels.library.amx_allowed`)."""
        return bool(self._lib.amx_linear_available())

    def _amx_operands(self, x: torch.Tensor, packed: torch.Tensor, n: int, name: str) -> None:
        require(self.amx_linear_available(), f"{name}: no AMX-BF16 tiles on this CPU / process")
        cpu_contiguous(x, 2, (torch.bfloat16,), f"{name} takes contiguous 2-D bfloat16 CPU activations")
        k = x.shape[1]
        require(packed.dim() == 4 and packed.is_contiguous() and packed.dtype == torch.bfloat16
                and tuple(packed.shape) == (-(-n // _TILE_N), -(-k // _TILE_K), _TILE_ROWS, 2 * _TILE_N),
                "packed must be the weight's B tiles [N/16, K/32, 16, 32] for these K and N")

    def amx_linear(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                   out_features: int) -> torch.Tensor:
        """bfloat16 x [M, K] -> x W^T + b [M, N] on AMX tiles (``packed``: ``pack_amx_weight``)."""
        self._amx_operands(x, packed, out_features, "amx_linear")
        bias_ptr = optional_bias(bias, out_features)
        out = torch.empty((x.shape[0], out_features), dtype=torch.bfloat16)
        self._lib.call("kvserve_amx_linear", ptr(x), ptr(packed), bias_ptr, ptr(out), x.shape[0], x.shape[1],
                       out_features, 0)
        return out

    def amx_linear_silu_mul(self, x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
        """silu_and_mul(amx_linear(x, packed, None, out_features)) in one pass, the same bits;
        out_features = 2d with d a multiple of 16."""
        self._amx_operands(x, packed, out_features, "amx_linear_silu_mul")
        require(out_features % (2 * _TILE_N) == 0,
                f"amx_linear_silu_mul: out_features must be 2d with d a multiple of {_TILE_N}, got {out_features}")
        out = torch.empty((x.shape[0], out_features // 2), dtype=torch.bfloat16)
        self._lib.call("kvserve_amx_linear", ptr(x), ptr(packed), None, ptr(out), x.shape[0], x.shape[1],
                       out_features, 1)
        return out

    def quant_linear_isa(self) -> int:
        """This library's instruction set for ``quant_linear`` (its variant's): 1 portable
        (x86_64), 2 AVX2 + FMA (avx2), 3 AVX-512F (avx512), 4 AVX-512F with AVX512-BF16
        (avx512_bf16: bfloat16 activations in pairs)."""
        return self._lib.quant_linear_isa()

    def quant_linear_layout(self) -> list[int]:
        """(vector width, vectors per panel) of this library's quantized panels."""
        layout = (ctypes.c_int64 * 2)()
        self._lib.call("kvserve_quant_linear_layout", ctypes.addressof(layout))
        return [layout[0], layout[1]]

    def quant_linear(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                     neg_offsets: torch.Tensor | None, bias: torch.Tensor | None, out_features: int,
                     group_size: int, bits: int, codebook: int = 0) -> torch.Tensor:
        """x [M, K] float32 or bfloat16 over int8/int4 panels in this library's layout -> [M, N] in
        x's dtype (the layouts: ``quant_linear.cpp``; codebook 1: 4-bit codes are MXFP4's E2M1
        values doubled, ``CODEBOOKS``)."""
        width, vectors = self.quant_linear_layout()
        nr = width * vectors
        cpu_contiguous(x, 2, FLOAT_DTYPES, "x must be a contiguous 2-D float32 or bfloat16 CPU tensor")
        require(bits in (8, 4), "bits must be 8 or 4")
        m, k = x.shape
        panels = -(-out_features // nr)
        require(group_size > 0 and k % group_size == 0, "group_size must divide in_features")
        offsets, bias_ptr = _quant_weight(
            packed, (panels, k, nr if bits == 8 else nr // 2), "packed must be uint8 [P, K, row bytes] from "
            "kvserve.model.quant_linear", scales, (panels, k // group_size, nr),
            "scales must be float32 [P, K / group_size, kNR]", neg_offsets, bits, bias, out_features)
        out = torch.empty((m, out_features), dtype=x.dtype)
        _check_codebook(codebook, bits, neg_offsets)
        self._lib.call("kvserve_quant_linear", code(x.dtype), ptr(x), ptr(out), m, k, ptr(packed), ptr(scales), offsets,
                       bias_ptr, out_features, group_size, bits, codebook)
        return out

    def amx_quant_linear(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                         neg_offsets: torch.Tensor | None, bias: torch.Tensor | None, out_features: int,
                         group_size: int, bits: int, codebook: int = 0) -> torch.Tensor:
        """bfloat16 x [M, K] over int8/int4 blocks on AMX tiles -> [M, N] bfloat16 (the layout:
        ``amx_quant_linear.cpp``)."""
        require(self.amx_linear_available(), "amx_quant_linear: no AMX-BF16 tiles on this CPU / process")
        cpu_contiguous(x, 2, (torch.bfloat16,), "amx_quant_linear takes contiguous 2-D bfloat16 CPU activations")
        require(bits in (8, 4), "bits must be 8 or 4")
        m, k = x.shape
        block_cols = _TILE_N if bits == 8 else 4 * _TILE_N
        blocks, chunks = -(-out_features // block_cols), -(-k // _TILE_K)
        require(group_size == k or (group_size % _TILE_K == 0 and k % group_size == 0),
                "group_size must be K or a multiple of 32 that divides K")
        offsets, bias_ptr = _quant_weight(
            packed, (blocks, chunks * (_TILE_K if bits == 8 else _TILE_K // 2), block_cols),
            "packed must be uint8 [N/16, K', 16] (int8) or [N/64, K'/2, 64] (int4) from "
            "kvserve.model.quant_linear.pack_quantized_amx", scales, (blocks, k // group_size, block_cols),
            "scales must be float32 [blocks, K / group_size, block columns] like packed", neg_offsets, bits, bias,
            out_features)
        out = torch.empty((m, out_features), dtype=torch.bfloat16)
        _check_codebook(codebook, bits, neg_offsets)
        self._lib.call("kvserve_amx_quant_linear", ptr(x), ptr(out), m, k, ptr(packed), ptr(scales), offsets, bias_ptr,
                       out_features, group_size, bits, codebook)
        return out

    def lora_apply(self, x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, order: torch.Tensor,
                   seg_starts: torch.Tensor, seg_slots: torch.Tensor, shard_offsets: torch.Tensor, rank: int) -> None:
        """y[t] += B_s A_s x[t], each token with its adapter slot (``lora.cpp``)."""
        require(x.dim() == 2 and y.dim() == 2 and x.is_contiguous() and y.is_contiguous() and x.shape[0] == y.shape[0],
                "x [T, K] and y [T, N] must be contiguous with the same rows")
        require(x.dtype == y.dtype and x.dtype in FLOAT_DTYPES, "x and y must both be float32 or both bfloat16")
        require(a.dim() == 3 and b.dim() == 3 and a.is_contiguous() and b.is_contiguous() and a.dtype == b.dtype
                and a.dtype in FLOAT_DTYPES, "a [slots, K, R] and b [slots, rank, N] must be contiguous float32 or bfloat16")
        k, n, r, shards = x.shape[1], y.shape[1], a.shape[2], shard_offsets.numel() - 1
        require(a.shape[1] == k and b.shape[2] == n and b.shape[1] == rank and r == shards * rank
                and a.shape[0] == b.shape[0], "a, b and the shards do not match x and y")
        for t in (order, seg_starts, seg_slots, shard_offsets):
            require(t.dtype == torch.int64 and t.is_contiguous() and t.device.type == "cpu",
                    "index tensors must be contiguous int64")
        require(seg_starts.numel() == seg_slots.numel() + 1, "seg_starts needs one more entry than seg_slots")
        require(shards >= 0, "shard_offsets needs one more entry than there are shards")
        self._lib.call("kvserve_lora_apply", code(x.dtype), code(a.dtype), ptr(x), ptr(y), ptr(a), ptr(b), ptr(order),
                       ptr(seg_starts), ptr(seg_slots), ptr(shard_offsets), seg_slots.numel(), shards, k, n, r, rank,
                       x.shape[0], order.numel(), a.shape[0])
