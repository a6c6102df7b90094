"""The runner's side of LoRA: adapters read from disk into a CPU cache, copied into the model's
preallocated slots, and each step's token -> slot map.

    LoRARequest ──key_of──► dense key (the persistent batch's per-row column; 0 = base model)
                ──ensure_loaded──► CPU cache (LRU, --max-cpu-loras adapters; a miss reads the folder)
    a step's rows ──activate──► slots (--max-loras; a missing adapter takes a free slot or the
                                least recently used one no row of this step needs) ──► LoRABatch

The scheduler admits at most ``max_loras`` adapters among running requests, so a step never
needs more slots than there are.

Under tensor parallelism every rank has a manager over its shard, with the same slots. The
driver's decides (slots, token -> slot map) and each forward carries its decisions to the other
ranks (``step_message`` -> ``kvserve.distributed.messages.LoRAStep`` -> ``apply_step``); every
rank writes its slice of an adapter into a slot (``kvserve.distributed.lora``)::

    column-parallel  qkv_proj, gate_up_proj   B's rows of the rank's output rows, A whole
    row-parallel     o_proj, down_proj        A's columns of the rank's input columns, B whole;
                                              wraps the layer's inner linear, so the partial
                                              B (A_r x_r) joins the partial base product before
                                              the layer's one all-reduce (summed once, before
                                              the bias)
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from kvserve.config import LoRAConfig
from kvserve.kernels import kernels_for
from kvserve.lora.layers import LoRABatch, LoRALinear
from kvserve.lora.peft_adapter import LoRAWeights, check_base_model, load_adapter, module_shapes
from kvserve.lora.request import LoRARequest
from kvserve.model.arch_config import ModelArchConfig

if TYPE_CHECKING:
    from kvserve.distributed.messages import LoRAStep
    from kvserve.distributed.shard import TensorParallelShard

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Our module names -> where they live in a decoder layer.
_MODULE_PATHS = {"qkv_proj": "self_attn", "o_proj": "self_attn", "gate_up_proj": "mlp", "down_proj": "mlp"}
_ROW_PARALLEL = ("o_proj", "down_proj")


def lora_dtype(config: LoRAConfig, model_dtype: torch.dtype) -> torch.dtype:
    """``--lora-dtype``: ``auto`` = the model's dtype."""
    return model_dtype if config.lora_dtype == "auto" else _DTYPES[config.lora_dtype]


def _kernels_for(device: torch.device, model_dtype: torch.dtype, dtype: torch.dtype):
    """lora.cpp where the device has kernels and both dtypes are float32 or bfloat16."""
    if model_dtype not in (torch.float32, torch.bfloat16) or dtype not in (torch.float32, torch.bfloat16):
        return None
    return kernels_for(device)


class LoRAManager:
    """Wraps ``model``'s projections in ``LoRALinear`` (in place) and keeps their slots.

    Args:
        model: a loaded decoder (``model.model.layers[i].self_attn.qkv_proj`` ...), after its
            linears were swapped for the invariant ones.
        arch: its config.
        config: the LoRA flags.
        device: the model's device.
        model_dtype: the model's dtype.
        shard: the rank's share under tensor parallelism (``model`` is then the rank's shard);
            None = the whole model.
    """

    def __init__(self, model: nn.Module, arch: ModelArchConfig, config: LoRAConfig, device: torch.device,
                 model_dtype: torch.dtype, shard: TensorParallelShard | None = None):
        check_base_model(arch)
        self.arch, self.config, self.device, self.shard = arch, config, device, shard
        self.dtype = lora_dtype(config, model_dtype)
        kernels = _kernels_for(device, model_dtype, self.dtype)
        self.layers = self._wrap(model, kernels)
        self.slots: list[LoRARequest | None] = [None] * config.max_loras
        self._slot_used = [0] * config.max_loras  # step counter of last use (LRU)
        self._step = 0
        self.cache: OrderedDict[LoRARequest, LoRAWeights] = OrderedDict()
        self._keys: dict[LoRARequest, int] = {}
        self._requests: dict[int, LoRARequest] = {}
        self.num_disk_loads = 0
        self._batch: LoRABatch | None = None
        # Tensor parallelism, the driver: slots written since the last forward's message.
        self._pending_loads: list[tuple[int, LoRARequest]] = []

    def _wrap(self, model: nn.Module, kernels) -> list[dict[str, LoRALinear]]:
        shapes = module_shapes(self.arch if self.shard is None else self.shard.local_arch())
        wrapped = []
        for layer in model.model.layers:
            modules = {}
            for name, parent_name in _MODULE_PATHS.items():
                parent, attr = getattr(layer, parent_name), name
                if self.shard is not None and name in _ROW_PARALLEL:  # a RowParallelLinear
                    parent, attr = getattr(parent, name), "linear"
                in_features, outs = shapes[name]
                module = LoRALinear(getattr(parent, attr), in_features, list(outs), self.config.max_loras,
                                    self.config.max_lora_rank, self.dtype, self.device, kernels)
                setattr(parent, attr, module)
                modules[name] = module
            wrapped.append(modules)
        return wrapped

    # -- adapters ----------------------------------------------------------------------------------

    def key_of(self, lora_request: LoRARequest | None) -> int:
        """A dense key per adapter (never reused), 0 for the base model."""
        if lora_request is None:
            return 0
        key = self._keys.get(lora_request)
        if key is None:
            key = self._keys[lora_request] = len(self._keys) + 1
            self._requests[key] = lora_request
        return key

    def ensure_loaded(self, lora_request: LoRARequest) -> LoRAWeights:
        """The adapter's weights from the CPU cache, read from its folder on a miss (the least
        recently used adapter beyond ``--max-cpu-loras`` is dropped).

        Raises:
            LoRAAdapterError: the folder cannot be read or does not fit the model.
        """
        weights = self.cache.get(lora_request)
        if weights is not None:
            self.cache.move_to_end(lora_request)
            return weights
        weights = load_adapter(lora_request.lora_path, self.arch, self.config.max_lora_rank, self.dtype)
        self.num_disk_loads += 1
        logger.info("LoRA adapter %s loaded from %s (rank %d, %.1f MB)", lora_request.lora_name,
                    lora_request.lora_path, weights.rank, weights.num_bytes / 1e6)
        self.cache[lora_request] = weights
        while len(self.cache) > self.config.cpu_cache_size:
            evicted, _ = self.cache.popitem(last=False)
            logger.info("LoRA adapter %s dropped from the CPU cache (--max-cpu-loras %d)", evicted.lora_name,
                        self.config.cpu_cache_size)
        return weights

    # -- one step ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def activate(self, row_keys: np.ndarray, num_scheduled: np.ndarray) -> Iterator[None]:
        """Put the adapters of a step's rows in slots and give every ``LoRALinear`` the token ->
        slot map for the forward inside the ``with`` (cleared after it).

        Args:
            row_keys: int [B], each row's ``key_of`` (0: base model).
            num_scheduled: int [B], tokens each row computes (its tokens are consecutive).

        Raises:
            RuntimeError: more adapters than slots (the scheduler prevents it).
            LoRAAdapterError: an adapter's folder cannot be read again.
        """
        with self._using(self._make_batch(row_keys, num_scheduled)):
            yield

    @contextlib.contextmanager
    def _using(self, batch: LoRABatch | None) -> Iterator[None]:
        self._batch = batch
        for modules in self.layers:
            for module in modules.values():
                module.batch = batch
        try:
            yield
        finally:
            self._batch = None
            for modules in self.layers:
                for module in modules.values():
                    module.batch = None

    # -- tensor parallelism ------------------------------------------------------------------------

    def step_message(self) -> LoRAStep | None:
        """The driver, inside ``activate``: what the other ranks need for this forward (the slots
        written since the last message, the token -> slot map), or None when there is nothing."""
        from kvserve.distributed.messages import LoRAStep

        token_slots = None if self._batch is None else self._batch.token_slots
        if token_slots is None and not self._pending_loads:
            return None
        step = LoRAStep(tuple(self._pending_loads), token_slots)
        self._pending_loads.clear()
        return step

    def apply_step(self, step: LoRAStep | None) -> contextlib.AbstractContextManager:
        """A worker rank: write the driver's slot loads (this rank's slices), then give every
        ``LoRALinear`` the token -> slot map for the forward inside the ``with``.

        Raises:
            LoRAAdapterError: an adapter's folder cannot be read on this rank.
        """
        if step is None:
            return contextlib.nullcontext()
        for slot, request in step.loads:
            self._load_slot(slot, request)
        return self._using(None if step.token_slots is None else LoRABatch(step.token_slots))

    def _make_batch(self, row_keys: np.ndarray, num_scheduled: np.ndarray) -> LoRABatch | None:
        keys = [int(k) for k in np.unique(row_keys) if k > 0]
        if not keys:
            return None
        if len(keys) > len(self.slots):
            raise RuntimeError(f"{len(keys)} adapters in one step but --max-loras is {len(self.slots)}")
        self._step += 1
        slot_of_key = self._assign_slots([self._requests[k] for k in keys])
        lookup = np.full(max(keys) + 1, -1, dtype=np.int64)
        for key in keys:
            lookup[key] = slot_of_key[self._requests[key]]
        return LoRABatch(np.repeat(lookup[row_keys.astype(np.int64)], num_scheduled))

    def _assign_slots(self, needed: list[LoRARequest]) -> dict[LoRARequest, int]:
        resident = {request: slot for slot, request in enumerate(self.slots) if request is not None}
        wanted = set(needed)
        result = {}
        for request in needed:
            slot = resident.get(request)
            if slot is None:
                slot = self._free_slot(wanted)
                self._load_slot(slot, request)
                if self.shard is not None:
                    self._pending_loads.append((slot, request))
            self._slot_used[slot] = self._step
            result[request] = slot
        return result

    def _free_slot(self, wanted: set[LoRARequest]) -> int:
        """An empty slot, else the least recently used slot whose adapter this step does not need."""
        for slot, request in enumerate(self.slots):
            if request is None:
                return slot
        candidates = [s for s, request in enumerate(self.slots) if request not in wanted]
        return min(candidates, key=lambda s: (self._slot_used[s], s))

    def _load_slot(self, slot: int, request: LoRARequest) -> None:
        weights = self.ensure_loaded(request)
        self.slots[slot] = None  # a failure below leaves the slot empty, never half written
        for layer, modules in enumerate(self.layers):
            for name, module in modules.items():
                module_weights = weights.modules.get((layer, name))
                if self.shard is not None and module_weights is not None:
                    from kvserve.distributed.lora import shard_module_lora

                    module_weights = shard_module_lora(module_weights, name, self.shard)
                module.set_slot(slot, module_weights)
        self.slots[slot] = request

    def remove(self, lora_request: LoRARequest) -> None:
        """Forget an adapter's cached weights (its slot is reused when needed)."""
        self.cache.pop(lora_request, None)
