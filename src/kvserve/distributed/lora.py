"""A tensor-parallel rank's slice of a LoRA adapter (vLLM's ``ColumnParallelLinearWithLoRA`` /
``RowParallelLinearWithLoRA`` split; Megatron-LM's split applied to ``y = W x + B (A x)``).

For rank ``r`` (row ranges of ``TensorParallelShard.rows_of``)::

    qkv_proj, gate_up_proj   column-parallel: the rank computes output rows R_j of shard j
                             (q/k/v, gate/up); B_j[R_j, :] with the whole A_j (the input is
                             replicated): the rank's rows of B_j (A_j x) exactly
    o_proj, down_proj        row-parallel: the rank holds input columns C; A[:, C] with the whole
                             B: B (A[:, C] x_C) is a partial sum, and the layer's all-reduce adds
                             the ranks' partials (sum over r of A[:, C_r] x_C_r = A x)
"""

from __future__ import annotations

from kvserve.distributed.shard import TensorParallelShard
from kvserve.lora.peft_adapter import ModuleLoRA

# Fused module -> the checkpoint projection of each of its shards.
_COLUMN_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def shard_module_lora(weights: ModuleLoRA, name: str, shard: TensorParallelShard) -> ModuleLoRA:
    """``weights`` of module ``name`` (qkv_proj, gate_up_proj, o_proj or down_proj), sliced for
    ``shard`` (views of the CPU tensors: ``LoRALinear.set_slot`` copies them)."""
    if name in _COLUMN_SHARDS:
        b = tuple(None if b_j is None else b_j[slice(*shard.rows_of(part))]
                  for b_j, part in zip(weights.b, _COLUMN_SHARDS[name], strict=True))
        return ModuleLoRA(weights.a, b)
    columns = slice(*shard.rows_of(name))
    return ModuleLoRA(tuple(None if a is None else a[:, columns] for a in weights.a), weights.b)
