"""The model runtime: checkpoint loading, our decoder implementations and the model runner.

Public entry points::

    load_model(model_dir, dtype="auto", device="cpu") -> LoadedModel
    ModelRunner(loaded, num_blocks, block_size, device).execute_model(scheduler_output) -> logits
    kv_cache_bytes_per_block(arch, block_size, dtype) -> int
"""

from kvserve.model.arch_config import ModelArchConfig, RopeScaling
from kvserve.model.loader import LoadedModel, load_model
from kvserve.model.registry import get_model_class, supported_architectures
from kvserve.model.runner import ModelInputs, ModelRunner, ModelStepOutput, kv_cache_bytes_per_block

__all__ = [
    "LoadedModel",
    "ModelArchConfig",
    "ModelInputs",
    "ModelRunner",
    "ModelStepOutput",
    "RopeScaling",
    "get_model_class",
    "kv_cache_bytes_per_block",
    "load_model",
    "supported_architectures",
]
