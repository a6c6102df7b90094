"""What a loaded model's weights are, in one line (the start-up log; the short label of the
flags is ``QuantizationConfig.label``)::

    bfloat16
    int8 (per channel); LM head bfloat16
    int4 (group 32, symmetric); LM head int4 (group 32, symmetric)
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from kvserve.model.quant_linear import QuantizedLinear


def linear_format(layer: nn.Module, dtype: torch.dtype) -> str:
    """The weight format of one linear layer, e.g. ``int4 (group 32, symmetric)`` or ``bfloat16``."""
    if isinstance(layer, QuantizedLinear):
        return layer.format()
    weight_dtype = getattr(layer, "weight_dtype", None) or getattr(getattr(layer, "weight", None), "dtype", dtype)
    return str(weight_dtype).removeprefix("torch.")


def describe_weights(model: nn.Module, dtype: torch.dtype) -> str:
    """The summary line (module docstring) of ``model``'s linear layers; the LM head is named
    when the others are quantized."""
    head = getattr(model, "lm_head", None)
    formats = Counter(linear_format(m, dtype) for m in model.modules()
                      if isinstance(m, (nn.Linear, QuantizedLinear)) and m is not head)
    body = ", ".join(f"{fmt} x {count}" if len(formats) > 1 else fmt for fmt, count in formats.most_common())
    body = body or str(dtype).removeprefix("torch.")
    if head is None or not any(isinstance(m, QuantizedLinear) for m in model.modules()):
        return body
    return f"{body}; LM head {linear_format(head, dtype)}"
