"""A mixture-of-experts feed-forward in one call (``csrc/moe.cpp``): ``MoeLayer`` as
``kvserve.model.moe`` builds it (and ``kvserve.model.fused_decoder`` gives to a decoder layer), and
the router's top-k on its own (``moe_route``, for tests)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from kvserve.kernels.ops_decoder import LinearPart
from kvserve.kernels.tensors import code, ptr, require


ROUTINGS = {"softmax_topk": 0, "topk_softmax": 1, "external": 2}  # csrc/moe.h: MoeRouting
ACTIVATIONS = {"silu": 0, "swiglu_clamped": 1}  # csrc/moe.h: MoeActivation; MoeConfig.activation's names


class MoeLayer:
    """A mixture-of-experts feed-forward in C++ (``moe.cpp``) over its linears' packed weights:
    ``forward(x [T, hidden]) -> [T, hidden]`` in the dtype it was built for. ``routing`` and
    ``activation`` name ``ROUTINGS`` and ``ACTIVATIONS`` (``alpha``, ``limit``: the clamped
    SwiGLU's); with ``routing="external"`` the caller routes (``forward(x, weights, ids)``; the
    router part gives the number of experts only). ``shared``: the shared expert's [gate_up, down,
    gate] (its output times the sigmoid of the gate) or [gate_up, down] (added as it is);
    ``expert_biases``: per expert ([2 * intermediate] for gate_up, [hidden] for down) in the dtype,
    or None. ``gate_up``/``down`` may be a share of the router's experts, from
    ``first_expert`` (expert parallelism): tokens routed elsewhere add nothing here. Holds the
    parts and tensors it was given."""

    def __init__(self, lib, dtype: torch.dtype, top_k: int, normalize: bool, weights_float32: bool,
                 router: LinearPart, gate_up: Sequence[LinearPart], down: Sequence[LinearPart],
                 shared: Sequence[LinearPart] | None = None, routing: str = "softmax_topk",
                 activation: str = "silu", alpha: float = 0.0, limit: float = 0.0,
                 expert_biases: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]] | None = None,
                 first_expert: int = 0):
        num_experts = router.out_features
        require(len(gate_up) == len(down) > 0 and 0 <= first_expert and first_expert + len(gate_up) <= num_experts
                and 1 <= top_k <= num_experts,
                "MoeLayer: one gate_up and one down per held expert (first_expert on), within the router's experts")
        require(shared is None or len(shared) in (2, 3), "MoeLayer: the shared expert is [gate_up, down(, gate)]")
        require(routing in ROUTINGS and activation in ACTIVATIONS,
                f"MoeLayer: routing in {sorted(ROUTINGS)}, activation in {sorted(ACTIVATIONS)}")
        self._lib, self.dtype = lib, dtype
        self.hidden_size = router.in_features
        self._parts = [router, *gate_up, *down, *(shared or ())]
        experts = len(gate_up)
        biases = [None, None]
        if expert_biases is not None:
            gate_up_bias, down_bias = expert_biases
            require(len(gate_up_bias) == len(down_bias) == experts
                    and all(b.dtype == dtype and b.is_contiguous() and b.shape == (2 * down[0].in_features,)
                            for b in gate_up_bias)
                    and all(b.dtype == dtype and b.is_contiguous() and b.shape == (router.in_features,)
                            for b in down_bias),
                    "MoeLayer: one contiguous gate_up bias [2 * intermediate] and down bias [hidden] per expert, "
                    "in the layer's dtype")
            self._parts += [*gate_up_bias, *down_bias]
            biases = [(ctypes.c_void_p * experts)(*(ptr(b) for b in gate_up_bias)),
                      (ctypes.c_void_p * experts)(*(ptr(b) for b in down_bias))]
        handle = ctypes.c_void_p()
        lib.call("kvserve_moe_create", num_experts, first_expert, experts, top_k, router.in_features,
                 down[0].in_features, int(normalize), int(weights_float32), ROUTINGS[routing],
                 ACTIVATIONS[activation], alpha, limit,
                 ctypes.byref(router), (LinearPart * experts)(*gate_up), (LinearPart * experts)(*down), *biases,
                 None if shared is None else (LinearPart * len(shared))(*shared), int(shared is not None and len(shared) == 3),
                 ctypes.byref(handle))
        self.routing, self.top_k, self.num_experts = routing, top_k, num_experts
        self.handle = handle

    def __del__(self):
        handle = getattr(self, "handle", None)
        if handle is not None and handle.value:
            self._lib.moe_destroy(handle)

    def forward(self, x: torch.Tensor, weights: torch.Tensor | None = None, ids: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; with ``routing="external"``, the routing weights float32
        [T, top_k] and expert ids [T, top_k] (any integer dtype) are the caller's."""
        require(x.dim() == 2 and x.is_contiguous() and x.dtype == self.dtype and x.shape[1] == self.hidden_size,
                "MoeLayer: x [T, hidden] contiguous in the layer's dtype")
        out = torch.empty_like(x)
        if self.routing != "external":
            require(weights is None and ids is None, "MoeLayer: this layer routes its tokens itself")
            self._lib.call("kvserve_moe_forward", self.handle, code(x.dtype), ptr(x), ptr(out), x.shape[0])
            return out
        require(weights is not None and ids is not None and weights.shape == ids.shape == (x.shape[0], self.top_k)
                and weights.dtype == torch.float32, f"MoeLayer: float32 weights and ids [T, {self.top_k}]")
        weights, ids = weights.contiguous(), ids.to(torch.int32).contiguous()
        self._lib.call("kvserve_moe_forward_routed", self.handle, code(x.dtype), ptr(x), ptr(weights), ptr(ids),
                       ptr(out), x.shape[0])
        return out


class MoeOps:
    """The MoE kernels' wrappers."""

    def MoeLayer(self, **kwargs) -> MoeLayer:  # noqa: N802 - named as the class it builds
        return MoeLayer(self._lib, **kwargs)

    def moe_route(self, logits: torch.Tensor, top_k: int, normalize: bool,
                  routing: str = "softmax_topk") -> tuple[torch.Tensor, torch.Tensor]:
        """(weights float32 [T, k], ids int32 [T, k]) of router logits [T, E] as ``moe.cpp`` routes
        them (softmax in float32, the top k, of equal probabilities the lowest expert first; or
        ``topk_softmax``: the top k logits, then their softmax)."""
        require(logits.dim() == 2 and logits.is_contiguous() and logits.dtype in (torch.float32, torch.bfloat16)
                and 1 <= top_k <= logits.shape[1], "moe_route: contiguous float32/bfloat16 logits [T, E], 1 <= k <= E")
        require(routing in ROUTINGS and routing != "external",
                f"moe_route: routing in {sorted(set(ROUTINGS) - {'external'})}")
        weights = torch.empty((logits.shape[0], top_k), dtype=torch.float32)
        ids = torch.empty((logits.shape[0], top_k), dtype=torch.int32)
        self._lib.call("kvserve_moe_route", code(logits.dtype), ptr(logits), logits.shape[0], logits.shape[1], top_k,
                       int(normalize), ROUTINGS[routing], ptr(weights), ptr(ids))
        return weights, ids
