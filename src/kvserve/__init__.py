"""kvserve: an LLM serving engine on PyTorch."""

from kvserve.sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = ["LLM", "BeamSearchParams", "LoRARequest", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # ``from kvserve import LLM`` without importing torch and the engine on ``import kvserve``.
    if name == "LLM":
        from kvserve.engine.llm import LLM

        return LLM
    if name == "BeamSearchParams":
        from kvserve.beam_search import BeamSearchParams

        return BeamSearchParams
    if name == "LoRARequest":
        from kvserve.lora.request import LoRARequest

        return LoRARequest
    raise AttributeError(f"module 'kvserve' has no attribute {name!r}")
