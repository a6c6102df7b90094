"""kvserve: an LLM serving engine on PyTorch."""

from kvserve.sampling_params import SamplingParams

__version__ = "0.1.0"

__all__ = ["SamplingParams", "__version__"]
