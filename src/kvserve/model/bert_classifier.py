"""Cross-encoders: BERT and (XLM-)RoBERTa sequence classifiers (transformers'
``BertForSequenceClassification``, ``XLMRobertaForSequenceClassification``,
``RobertaForSequenceClassification``), pooling models of task ``classify``.

The encoder (``kvserve.model.bert``) gives the prompt's final hidden states; the pooler takes the
first token's ([CLS] / <s>) and calls :meth:`classify` on it (``kvserve.pooling.pooler``)::

    BERT:     CLS [H] ─► bert.pooler.dense ─► tanh ─► classifier            ─► logits [num_labels]
    RoBERTa:  CLS [H] ─► classifier.dense  ─► tanh ─► classifier.out_proj   ─► logits [num_labels]

The heads run in float32 whatever the model's dtype (``head_modules``, kept float32 by the loader),
as vLLM's ``head_dtype``. A BERT pair's segment ids reach the embeddings as ``token_type_ids``
(``uses_token_type_ids``); RoBERTa has one segment type.

Source: transformers ``modeling_bert.py`` (``BertPooler``, ``BertForSequenceClassification``),
``modeling_xlm_roberta.py`` (``XLMRobertaClassificationHead``); vLLM 0.32
``vllm/model_executor/models/bert.py`` and ``roberta.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.bert import BertModel, XLMRobertaModel
from kvserve.pooling.classifier_config import read_classifier_config


class BertPoolerDense(nn.Module):
    """BERT's pooler: ``tanh(dense(x))`` on the CLS state (transformers' ``BertPooler``)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(x))


class RobertaClassificationHead(nn.Module):
    """``out_proj(tanh(dense(x)))`` on the <s> state (transformers' ``XLMRobertaClassificationHead``;
    its dropout is off at inference)."""

    def __init__(self, hidden_size: int, num_labels: int):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(x)))


class BertForSequenceClassification(nn.Module):
    """BERT cross-encoder (module docstring).

    ``forward(input_ids, positions, kv_caches, attn_metadata, token_type_ids=None)`` -> final hidden
    states [T, H] (model dtype); ``classify(pooled float32 [H])`` -> float32 logits [num_labels].
    """

    attn_type = "encoder_only"
    default_pooling_type = "CLS"
    pooling_task = "classify"
    checkpoint_renames = BertModel.checkpoint_renames
    checkpoint_ignored: tuple[str, ...] = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
    split_checkpoint_tensor = None
    head_modules: tuple[str, ...] = ("bert.pooler", "classifier")
    uses_token_type_ids = True

    def __init__(self, arch: ModelArchConfig, attn_backend: AttentionBackend | None = None):
        super().__init__()
        self.arch = arch
        num_labels = read_classifier_config(arch.raw).num_labels
        self.bert = BertModel(arch)
        self.bert.pooler = BertPoolerDense(arch.hidden_size)
        self.classifier = nn.Linear(arch.hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.bert(input_ids, positions, kv_caches, attn_metadata, token_type_ids)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """float32 [H] (the CLS state) -> float32 logits [num_labels]."""
        return self.classifier(self.bert.pooler(pooled.unsqueeze(0))).squeeze(0)


class XLMRobertaForSequenceClassification(nn.Module):
    """XLM-RoBERTa / RoBERTa cross-encoder (module docstring): positions after the padding id, one
    segment type, the RoBERTa head."""

    attn_type = "encoder_only"
    default_pooling_type = "CLS"
    pooling_task = "classify"
    checkpoint_renames = BertModel.checkpoint_renames
    checkpoint_ignored: tuple[str, ...] = ("roberta.embeddings.position_ids", "roberta.embeddings.token_type_ids",
                                           "roberta.pooler.")
    split_checkpoint_tensor = None
    head_modules: tuple[str, ...] = ("classifier",)
    uses_token_type_ids = False

    def __init__(self, arch: ModelArchConfig, attn_backend: AttentionBackend | None = None):
        super().__init__()
        self.arch = arch
        self.roberta = XLMRobertaModel(arch)
        self.classifier = RobertaClassificationHead(arch.hidden_size, read_classifier_config(arch.raw).num_labels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.roberta(input_ids, positions, kv_caches, attn_metadata)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """float32 [H] (the <s> state) -> float32 logits [num_labels]."""
        return self.classifier(pooled.unsqueeze(0)).squeeze(0)

    @classmethod
    def position_offset(cls, arch: ModelArchConfig) -> int:
        return XLMRobertaModel.position_offset(arch)


class RobertaForSequenceClassification(XLMRobertaForSequenceClassification):
    """RoBERTa (the same network as XLM-RoBERTa)."""
