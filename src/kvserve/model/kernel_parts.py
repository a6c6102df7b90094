"""The packed weights of a model's linear layers as the C++ loops take them
(``kvserve.kernels.ops_decoder.LinearPart``): what ``kvserve.model.fused_decoder`` hands a decoder
layer and ``kvserve.model.moe`` its experts. One place decides which linear runs on which kernel
(the layer's own ``kernel_weights``), so a C++ loop computes exactly what the module would."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from kvserve.model.invariant_linear import InvariantLinear
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.stacked_linear import StackedLinear

# LinearPart kinds (csrc/projection.h)
VECTOR, AMX, QUANT_VECTOR, QUANT_AMX = range(4)


def linear_parts(module: nn.Module, dtype: torch.dtype, kernels: ModuleType) -> list | None:
    """The ``LinearPart`` list that computes ``module`` on ``dtype`` activations exactly as its
    forward does, or None."""
    if type(module) is StackedLinear:
        parts = [linear_parts(part, dtype, kernels) for part in module.parts]
        return None if any(p is None for p in parts) else [p for sub in parts for p in sub]
    if type(module) is InvariantLinear:
        amx, packed = module.kernel_weights(dtype)
        return [kernels.LinearPart(kind=AMX if amx else VECTOR, packed=packed, scales=None, neg_offsets=None,
                                   bias=module.bias, input_perm=None, in_features=module.in_features,
                                   out_features=module.out_features, group_size=0, bits=0)]
    if type(module) is QuantizedLinear and module.on_kernels:
        amx, packed, scales, neg_offsets = module.kernel_weights(dtype)
        return [kernels.LinearPart(kind=QUANT_AMX if amx else QUANT_VECTOR, packed=packed, scales=scales,
                                   neg_offsets=neg_offsets, bias=module.bias, input_perm=module.input_perm,
                                   in_features=module.in_features, out_features=module.out_features,
                                   group_size=module.group_size, bits=module.bits,
                                   codebook=module.codebook_id)]
    return None
