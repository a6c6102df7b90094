"""The model runtime: checkpoint loading, our decoder implementations and the model runner.

Public entry points::

    load_model(model_dir, dtype="auto", device="cpu") -> LoadedModel
    ModelRunner(loaded, num_blocks, block_size, device).execute_model(scheduler_output) -> ModelRunnerOutput
    kv_cache_bytes_per_block(arch, block_size, dtype) -> int
"""

from kvserve.model.arch_config import ModelArchConfig, RopeScaling
from kvserve.model.loader import LoadedModel, load_model
from kvserve.model.registry import get_model_class, supported_architectures
from kvserve.model.model_inputs import ModelInputs
from kvserve.model.kv_cache_layout import kv_cache_bytes_per_block
from kvserve.model.runner import ModelRunner

__all__ = [
    "LoadedModel",
    "ModelArchConfig",
    "ModelInputs",
    "ModelRunner",
    "RopeScaling",
    "get_model_class",
    "kv_cache_bytes_per_block",
    "load_model",
    "supported_architectures",
]
