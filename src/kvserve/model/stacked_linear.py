"""``StackedLinear``: one projection whose output rows come from several layers of different
weight formats, e.g. a GGUF file's ``attn_q`` / ``attn_k`` in Q4_K and ``attn_v`` in Q6_K, which
fill the rows [q | k | v] of ``qkv_proj`` (``kvserve.model.gguf_loader``)::

    x [..., K] --> part 0 (rows 0 .. n0)   --\
              \-> part 1 (rows n0 .. n1)  ---+--> cat --> [..., N]
               \> ...                     --/

Each part is an ``nn.Linear`` or a ``QuantizedLinear`` (after ``use_invariant_linears``, an
``InvariantLinear``); every part computes its rows independently, so the result has the bits of
each part alone and stays batch-invariant when the parts are.
"""

from __future__ import annotations

import torch
from torch import nn


class StackedLinear(nn.Module):
    """``y = cat([part(x) for part in parts], -1)``: input [..., in_features] -> [..., sum of
    the parts' out_features], in the parts' output dtype.

    Args:
        parts: linear layers with the same ``in_features``.

    Raises:
        ValueError: no parts, or parts with different ``in_features``.
    """

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        if not parts or len({p.in_features for p in parts}) != 1:
            raise ValueError("StackedLinear needs one or more parts with the same in_features")
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"
