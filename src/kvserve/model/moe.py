"""The mixture-of-experts feed-forward of Mixtral, Qwen2-MoE, Qwen3-MoE and GPT-OSS (Shazeer et
al. 2017, "Outrageously Large Neural Networks"; Jiang et al. 2024, "Mixtral of Experts"; OpenAI
2025, "gpt-oss-120b & gpt-oss-20b Model Card").

For tokens x [T, hidden]::

    logits  = router(x)                                   [T, E], the model dtype
    probs   = softmax(float32(logits))                    [T, E]
    w, ids  = the top_k probs of each row                 ties: the lowest expert first
    w      /= sum(w)                                      norm_topk_prob (Mixtral: always)
    out[t]  = sum over the experts e of t, in increasing e, of w[t, e] * expert_e(x[t])
    out    += sigmoid(shared_gate(x)) * shared_expert(x)  Qwen2-MoE only

GPT-OSS routes the other way round (``routing = topk_softmax``: the top k logits, then a softmax
over those k, in float32 and rounded to the model dtype), its router and experts have biases (each
added after its product, in the model dtype, as transformers adds them) and its experts' gate is
clamped: ``(clamp(up, -l, l) + 1) * g * sigmoid(alpha * g)`` with ``g = min(gate, l)``
(``ClampedSwiGLU``).

DeepSeek-V2/V3 route in float32 from float32 inputs and in groups (``grouped_route``), multiply
the weights by ``routed_scaling_factor`` and add their shared experts ungated:
``out += shared_experts(x)``. Their router runs in torch operators on every device (on the
batch-invariant linear and sigmoid) and hands its weights and ids to the C++ layer on the CPU.

with expert_e(x) = down_e(silu(gate_e(x)) * up_e(x)), each expert an ``nn.Linear`` pair like a
dense MLP's (so the CPU kernels, int8/int4/MXFP4 weights and the loader's name mapping apply to
experts as they do to any linear). On the CPU the block runs in one C++ call over the linears'
packed weights (``kernels/csrc/moe.cpp``: the same steps, its own softmax exp), on CUDA the experts
in Triton's grouped GEMMs (``kernels/triton_moe.py``); the torch code below is the reference and
the path of other devices. Rows are routed independently and each token's experts are
summed in expert order, the order transformers' loop adds them in, so a token's output never
depends on the other tokens of the batch. The routing weight multiplies an expert's output in the
model dtype (Qwen) or in float32 (Mixtral), as each family's reference code does.

Checkpoint names (the per-expert tensors Hub checkpoints store)::

    ...mlp.gate.weight                               the router  [E, hidden]
    ...mlp.experts.{e}.{gate,up,down}_proj.weight     Qwen2/Qwen3-MoE
    ...block_sparse_moe.experts.{e}.{w1,w3,w2}.weight Mixtral (renamed at load, kvserve.model.mixtral)
    ...mlp.shared_expert.{gate,up,down}_proj.weight, ...mlp.shared_expert_gate.weight   Qwen2-MoE
    ...mlp.router.{weight,bias}, ...mlp.experts.{gate_up_proj,down_proj}[_bias]          GPT-OSS
                                 (all experts in one tensor each: kvserve.model.gpt_oss splits them)
    ...mlp.shared_experts.*, ...mlp.gate.e_score_correction_bias     DeepSeek (renamed at load,
                                 kvserve.model.deepseek)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.kernels import CpuKernels
from kvserve.kernels.triton_moe import TritonMoe, expert_table, triton_moe_for
from kvserve.kernels.ops_moe import ROUTINGS
from kvserve.model.arch_config import ModelArchConfig, MoeConfig
from kvserve.model.kernel_layer import KernelLayer
from kvserve.model.kernel_parts import linear_parts
from kvserve.model.layers import MergedLinear, RouterLinear, SiluAndMul


class ClampedSwiGLU(KernelLayer):
    """GPT-OSS's gate: input [..., 2 * d] = [gate | up] -> [..., d] =
    ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate, limit)``, each
    operation rounded to the input dtype as transformers computes it (the sigmoid on kvserve's
    kernel on the CPU: ``sigmoid``)."""

    def __init__(self, alpha: float, limit: float):
        super().__init__()
        self.alpha, self.limit = alpha, limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * sigmoid(gate * self.alpha, self.ops))


class ExpertMLP(nn.Module):
    """One gated expert: ``down_proj(act(gate(x), up(x)))``, [N, hidden] -> [N, hidden]; SwiGLU,
    or GPT-OSS's ``ClampedSwiGLU`` with a bias after each projection (``gate_up_bias`` [2 *
    intermediate] as [gate | up], ``down_bias`` [hidden]), each added in the dtype."""

    def __init__(self, hidden_size: int, intermediate_size: int, act_fn: nn.Module | None = None, bias: bool = False):
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden_size, [intermediate_size] * 2, ["gate_proj", "up_proj"], bias=False)
        self.act_fn = SiluAndMul() if act_fn is None else act_fn
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up_bias = nn.Parameter(torch.zeros(2 * intermediate_size)) if bias else None
        self.down_bias = nn.Parameter(torch.zeros(hidden_size)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.gate_up_bias is not None:
            gate_up = gate_up + self.gate_up_bias
        y = self.down_proj(self.act_fn(gate_up))
        return y if self.down_bias is None else y + self.down_bias


def route(logits: torch.Tensor, top_k: int, normalize: bool,
          routing: str = "softmax_topk") -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int64 [T, k]) of router logits [T, E]: softmax in
    float32, the k largest probabilities (a stable sort: of equal ones the lowest expert id),
    renormalised to sum to 1 when ``normalize``; ``topk_softmax``: the k largest logits (the same
    sort), then a softmax over them in float32."""
    if routing == "topk_softmax":
        values, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
        return torch.softmax(values[:, :top_k].float(), dim=-1), ids[:, :top_k]
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def grouped_route(logits: torch.Tensor, moe: MoeConfig, correction: torch.Tensor | None,
                  ops: CpuKernels | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int64 [T, k]) of DeepSeek's float32 router logits
    [T, E] (``MoeConfig.routing``): ``sigmoid_grouped`` scores ``sigmoid(logits)`` and chooses
    by ``scores + correction``, a group scored by the sum of its two best choices, the others
    out of the race at -inf; ``softmax_grouped`` scores and chooses by the softmax, a group by its
    best expert, the others at 0. The ``topk_group`` best groups, then the k best experts in them
    (stable sorts: of equal values the lowest group or expert); the weights are the scores,
    renormalised (``norm_topk_prob``, over sum + 1e-20) and times ``routed_scaling_factor``."""
    rows, experts = logits.shape
    if moe.routing == "sigmoid_grouped":
        scores = sigmoid(logits.contiguous(), ops)
        choice = scores + correction
        groups = choice.view(rows, moe.n_group, -1)
        group_scores = torch.sort(groups, dim=-1, descending=True, stable=True).values[..., :2].sum(dim=-1)
        out_of_race = float("-inf")
    else:
        scores = choice = torch.softmax(logits, dim=-1)
        group_scores = choice.view(rows, moe.n_group, -1).amax(dim=-1)
        out_of_race = 0.0
    if moe.topk_group < moe.n_group:
        best = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, : moe.topk_group]
        kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        choice = choice.masked_fill(~kept.repeat_interleave(experts // moe.n_group, dim=1), out_of_race)
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, : moe.top_k]
    weights = scores.gather(1, ids)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling_factor, ids


class Float32Vector(nn.Module):
    """A float32 vector that stays float32 when the model is cast (``model.to(bfloat16)``), as
    transformers keeps DeepSeek-V3's ``e_score_correction_bias``: rounded, it would choose
    other experts. ``value``: [n]."""

    def __init__(self, n: int):
        super().__init__()
        self.value = nn.Parameter(torch.zeros(n, dtype=torch.float32), requires_grad=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.value.dtype != torch.float32:
            self.value = nn.Parameter(self.value.detach().to(torch.float32), requires_grad=False)
        return self


def float32_router_logits(gate: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """DeepSeek's router logits, float32 [T, E]: ``F.linear(float32(x), float32(W))`` (the
    batch-invariant linear, once installed, takes float32 inputs against its weight as is)."""
    if isinstance(gate, nn.Linear):
        return F.linear(x.float(), gate.weight.float(), None if gate.bias is None else gate.bias.float())
    return gate(x.float())


class SparseMoeBlock(KernelLayer):
    """The MoE feed-forward of one layer (module docstring): [T, hidden] -> [T, hidden] in the
    input's dtype."""

    def __init__(self, arch: ModelArchConfig, moe: MoeConfig):
        super().__init__()
        self.moe = moe
        self.gate = RouterLinear(arch.hidden_size, moe.num_experts, bias=moe.router_bias)
        # the experts held here: all, or a rank's share under expert parallelism (experts[i] is
        # expert first_expert + i; tokens routed to the others add nothing on this rank)
        self.first_expert = moe.expert_range.start
        self.experts = nn.ModuleList(ExpertMLP(arch.hidden_size, moe.intermediate_size, self._activation(moe),
                                               moe.expert_bias)
                                     for _ in moe.expert_range)
        self.shared_expert = self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = ExpertMLP(arch.hidden_size, moe.shared_expert_intermediate_size)
            if moe.shared_expert_gated:
                self.shared_expert_gate = RouterLinear(arch.hidden_size, 1, bias=False)
        self.score_correction = Float32Vector(moe.num_experts) if moe.score_correction_bias else None
        self._kernel_layers: dict[tuple, object] = {}
        # the grouped GEMMs of the experts off the CPU (default: ``triton_moe_for`` the device at
        # the first call; the tests set them for CPU tensors under Triton's interpreter)
        self.triton_moe: TritonMoe | None = None
        self._triton_tables: dict[tuple, tuple] = {}

    @staticmethod
    def _activation(moe: MoeConfig) -> nn.Module:
        return ClampedSwiGLU(moe.swiglu_alpha, moe.swiglu_limit) if moe.activation == "swiglu_clamped" else SiluAndMul()

    def kernel_layer(self, dtype: torch.dtype):
        """This block in one C++ call (``kvserve.kernels.ops_moe.MoeLayer``) for ``dtype``
        activations on the CPU: made once the linears are on the kernels (after
        ``use_invariant_linears`` or quantization), or None (no kernels, other layers)."""
        kernels = self.ops
        if kernels is None or dtype not in (torch.float32, torch.bfloat16) or not (self.moe.grouped
                                                                                  or self.moe.routing in ROUTINGS):
            return None
        key = (dtype, id(self.gate), id(self.experts[0].gate_up_proj))  # new modules (quantized): a new layer
        if key not in self._kernel_layers:
            self._kernel_layers = {key: self._build_kernel_layer(kernels, dtype)}
        return self._kernel_layers[key]

    def _build_kernel_layer(self, kernels, dtype: torch.dtype):
        def one(module: nn.Module):
            parts = linear_parts(module, dtype, kernels)
            return parts[0] if parts is not None and len(parts) == 1 else None

        router = one(self.gate)
        gate_up, down = [one(e.gate_up_proj) for e in self.experts], [one(e.down_proj) for e in self.experts]
        shared = None
        if self.shared_expert is not None:
            shared = [one(self.shared_expert.gate_up_proj), one(self.shared_expert.down_proj)]
            if self.shared_expert_gate is not None:
                shared.append(one(self.shared_expert_gate))
        if router is None or any(p is None for p in (*gate_up, *down, *(shared or ()))):
            return None
        biases = None
        if self.moe.expert_bias:
            biases = tuple([getattr(e, name).detach().to(dtype).contiguous() for e in self.experts]
                           for name in ("gate_up_bias", "down_bias"))
        return kernels.MoeLayer(dtype=dtype, top_k=self.moe.top_k, normalize=self.moe.norm_topk_prob,
                                weights_float32=self.moe.routing_weights_float32, router=router, gate_up=gate_up,
                                down=down, shared=shared, routing="external" if self.moe.grouped else self.moe.routing,
                                activation=self.moe.activation,
                                alpha=self.moe.swiglu_alpha, limit=self.moe.swiglu_limit, expert_biases=biases,
                                first_expert=self.first_expert)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = self.kernel_layer(x.dtype) if x.dim() == 2 else None
        if layer is not None:
            return layer.forward(x.contiguous(), *(self._grouped_route(x) if self.moe.grouped else ()))
        tables = self.expert_tables(x.dtype, x.device) if x.dim() == 2 else None
        if tables is not None:
            weights, ids = self._route(x)
            out = self.triton_moe.experts(x.contiguous(), weights, ids, *tables, self.experts[0].act_fn,
                                          self.first_expert)
            return self._add_shared(x, out)
        return self.torch_forward(x)

    def expert_tables(self, dtype: torch.dtype, device: torch.device) -> tuple | None:
        """(gate-up, down) ``ExpertTable`` of the experts for activations of ``dtype`` on ``device``
        when the Triton grouped GEMMs apply (off the CPU, the experts in one format Triton reads),
        else None. With them the block's forward has no data-dependent shapes (CUDA graphs)."""
        if device.type == "cpu" and self.triton_moe is None:
            return None
        self.triton_moe = self.triton_moe or triton_moe_for(device)
        if self.triton_moe is None:
            return None
        key = (dtype, id(self.experts[0].gate_up_proj), id(self.experts[0].down_proj))
        if key not in self._triton_tables:
            experts = list(self.experts)
            bias = self.moe.expert_bias
            gate_up = expert_table([e.gate_up_proj for e in experts], [e.gate_up_bias for e in experts] if bias else None,
                                   dtype)
            down = expert_table([e.down_proj for e in experts], [e.down_bias for e in experts] if bias else None, dtype)
            self._triton_tables = {key: None if gate_up is None or down is None else (gate_up, down)}
        return self._triton_tables[key]

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] in float32 or the dtype, as each family multiplies by them; ids int64 [T, k])."""
        if self.moe.grouped:
            weights, ids = self._grouped_route(x)
        else:
            weights, ids = route(self.gate(x), self.moe.top_k, self.moe.norm_topk_prob, self.moe.routing)
        return (weights if self.moe.routing_weights_float32 else weights.to(x.dtype)), ids

    def _add_shared(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.shared_expert_gate is not None:
            return out + sigmoid(self.shared_expert_gate(x), self.ops) * self.shared_expert(x)
        if self.shared_expert is not None:
            return out + self.shared_expert(x)
        return out

    def _grouped_route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        correction = None if self.score_correction is None else self.score_correction.value
        return grouped_route(float32_router_logits(self.gate, x), self.moe, correction, self.ops)

    def torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block in torch operators (the module docstring's steps): the reference, and the
        path where the C++ layer does not apply."""
        weights, ids = self._route(x)
        out = torch.zeros_like(x)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert, increasing
        start = 0
        held = self.moe.expert_range
        for expert, count in enumerate(torch.bincount(flat, minlength=self.moe.num_experts).tolist()):
            pairs = order[start : start + count]
            start += count
            if count == 0 or expert not in held:
                continue
            rows = pairs // self.moe.top_k
            y = self.experts[expert - held.start](x.index_select(0, rows))
            out.index_add_(0, rows, (y * weights.flatten()[pairs, None]).to(x.dtype))
        return self._add_shared(x, out)


def sigmoid(x: torch.Tensor, ops: CpuKernels | None) -> torch.Tensor:
    """``F.sigmoid``, on kvserve's kernel where the calling layer has ``ops``: on the CPU torch
    computes a vector's worth of values and a tail with two different exp implementations, so a
    token's gate would change with the number of tokens in the step."""
    if ops is None or x.dtype not in (torch.float32, torch.bfloat16):
        return F.sigmoid(x)
    return ops.sigmoid(x.contiguous())
