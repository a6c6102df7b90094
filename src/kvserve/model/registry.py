"""Model registry: ``architectures[0]`` of config.json -> our ``nn.Module`` class.

Every registered class is built as ``cls(arch: ModelArchConfig, attn_backend: AttentionBackend)``
and offers ``forward(input_ids, positions, kv_caches, attn_metadata)`` -> the final hidden states
(after the final norm) and, for a generative model, ``compute_logits(hidden)`` (see
``kvserve.model.llama.LlamaForCausalLM``). Encoders (``kvserve.model.bert``,
``kvserve.model.modernbert``) set ``attn_type = "encoder_only"`` (bidirectional attention: pooling
only, whole prompts, no KV cache) and have no ``compute_logits``; a class's
``default_pooling_type`` (``CLS``, ``MEAN``, ``LAST``; LAST when absent, as vLLM's decoders) is how
it pools without a sentence-transformers configuration (``kvserve.pooling.config``). Sequence
classifiers (``kvserve.model.bert_classifier``; decoders through ``kvserve.model.seq_cls``) set
``pooling_task = "classify"`` and offer ``classify(pooled float32 [H]) -> float32 [num_labels]``.
"""

from __future__ import annotations

from torch import nn

from kvserve.errors import CheckpointError
from kvserve.model.bert import BertModel, RobertaModel, XLMRobertaModel
from kvserve.model.bert_classifier import (BertForSequenceClassification, RobertaForSequenceClassification,
                                           XLMRobertaForSequenceClassification)
from kvserve.model.dense_families import (
    GraniteForCausalLM,
    Olmo2ForCausalLM,
    Phi3ForCausalLM,
    SmolLM3ForCausalLM,
)
from kvserve.model.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
from kvserve.model.gemma import Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from kvserve.model.gpt_oss import GptOssForCausalLM
from kvserve.model.llama import LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM
from kvserve.model.modernbert import ModernBertModel
from kvserve.model.qwen2 import Qwen2ForCausalLM
from kvserve.model.qwen3 import Qwen3ForCausalLM
from kvserve.model.qwen_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
from kvserve.model.seq_cls import as_seq_cls_model

_MODELS: dict[str, type[nn.Module]] = {
    "BertModel": BertModel,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,
    "GptOssForCausalLM": GptOssForCausalLM,
    "GraniteForCausalLM": GraniteForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "ModernBertModel": ModernBertModel,
    "Olmo2ForCausalLM": Olmo2ForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "RobertaModel": RobertaModel,
    "SmolLM3ForCausalLM": SmolLM3ForCausalLM,
    "XLMRobertaModel": XLMRobertaModel,
    "BertForSequenceClassification": BertForSequenceClassification,
    "RobertaForSequenceClassification": RobertaForSequenceClassification,
    "XLMRobertaForSequenceClassification": XLMRobertaForSequenceClassification,
}
# Decoder rerankers and classifiers (vLLM's as_seq_cls_model), for the families tested with them.
_MODELS.update({cls.__name__: cls for cls in map(as_seq_cls_model, (
    LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM))})


def supported_architectures() -> list[str]:
    """Names accepted in config.json's ``architectures[0]``, sorted."""
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[nn.Module]:
    """The class for ``architecture``.

    Raises:
        CheckpointError: the architecture is not registered (the message lists the supported ones).
    """
    try:
        return _MODELS[architecture]
    except KeyError:
        raise CheckpointError(
            f"unknown architecture {architecture!r}; supported: {', '.join(supported_architectures())}"
        ) from None


def is_encoder_only(architecture: str) -> bool:
    """Whether ``architecture`` is a registered encoder (bidirectional attention, pooling only)."""
    model_cls = _MODELS.get(architecture)
    return model_cls is not None and getattr(model_cls, "attn_type", "decoder") == "encoder_only"


def default_pooling_task(architecture: str) -> str:
    """``classify`` for a registered sequence classifier, else ``embed``."""
    return getattr(_MODELS.get(architecture), "pooling_task", "embed")


def classifier_architecture(architecture: str) -> str | None:
    """The sequence classifier ``--convert classify`` makes of ``architecture``: itself when it is
    one, its ``*ForSequenceClassification`` for a ``*ForCausalLM`` that has one, else None."""
    if default_pooling_task(architecture) == "classify":
        return architecture
    converted = architecture.replace("ForCausalLM", "ForSequenceClassification")
    return converted if converted != architecture and converted in _MODELS else None


def default_pooling_type(architecture: str) -> str:
    """How ``architecture`` pools without a sentence-transformers configuration: its class's
    ``default_pooling_type``, else ``LAST`` (vLLM's default for adapted decoders)."""
    return getattr(_MODELS.get(architecture), "default_pooling_type", "LAST")
