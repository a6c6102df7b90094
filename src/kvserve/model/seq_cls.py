"""Decoders as sequence classifiers (vLLM's ``as_seq_cls_model``): ``Qwen3ForSequenceClassification``,
``Qwen2...``, ``Llama...``, ``Mistral...`` (config.json's architecture, ``--hf-overrides``, or a
``*ForCausalLM`` under ``--convert classify``) are the generative network with a ``score`` head
on the last token's state, a pooling model of task ``classify``::

    hidden [T, H] ─► LAST row (float32) ─► score (float32 [num_labels, H], no bias) ─► logits

The head comes from the checkpoint (``score.weight``: a fine-tuned classifier), or, when
config.json names ``classifier_from_token`` and a ``method`` (``kvserve.pooling.classifier_config``;
Qwen3-Reranker through ``is_original_qwen3_reranker``), from the LM head's rows of those tokens,
computed in float32 once at load and the LM head dropped::

    from_2_way_softmax:  score = lm_head[yes] - lm_head[no]      (one logit; sigmoid(logit) is
                                                                  softmax([no, yes])[yes])
    no_post_processing:  score = lm_head[tokens]                 (one logit per token)

Source: vLLM 0.32 ``vllm/model_executor/models/adapters.py`` (``as_seq_cls_model``,
``load_weights_using_from_2_way_softmax``, ``load_weights_no_post_processing``); the conversion of
https://huggingface.co/Qwen/Qwen3-Reranker-0.6B/discussions/3.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend
from kvserve.errors import CheckpointError
from kvserve.model.arch_config import ModelArchConfig
from kvserve.pooling.classifier_config import read_classifier_config


class _SequenceClassifier:
    """The methods a ``*ForSequenceClassification`` adds to its generative base class (mixed in
    first by :func:`as_seq_cls_model`)."""

    default_pooling_type = "LAST"
    pooling_task = "classify"
    head_modules: tuple[str, ...] = ("score",)

    def _init_head(self, arch: ModelArchConfig) -> None:
        self.classifier_config = read_classifier_config(arch.raw)
        if self.classifier_config.from_tokens is None:
            self.score = nn.Linear(arch.hidden_size, self.classifier_config.num_labels, bias=False)
            del self.lm_head  # a trained head replaces the LM head (not read from the checkpoint)

    @property
    def reads_lm_head(self) -> bool:
        """The head is made from LM-head rows: the loader reads ``lm_head`` for it."""
        return self.classifier_config.from_tokens is not None

    def load_head_from_lm_head(self, tokenizer: Any) -> None:
        """Build ``score`` (float32) from the loaded LM head's rows of ``from_tokens`` (module
        docstring), then drop the LM head.

        Raises:
            CheckpointError: a token the tokenizer does not have as one token.
        """
        config = self.classifier_config
        ids = []
        for token in config.from_tokens:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == tokenizer.unk_token_id or token_id >= self.lm_head.weight.shape[0]:
                raise CheckpointError(f"classifier_from_token {token!r} is not a token of this tokenizer")
            ids.append(token_id)
        rows = self.lm_head.weight.detach()[ids].to(torch.float32)
        weight = (rows[1] - rows[0]).unsqueeze(0) if config.method == "from_2_way_softmax" else rows
        score = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=torch.float32)
        with torch.no_grad():
            score.weight.copy_(weight)
        self.score = score
        del self.lm_head

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """float32 [H] (the last token's state) -> float32 logits [num_labels]."""
        return self.score(pooled.unsqueeze(0)).squeeze(0)


def as_seq_cls_model(base: type[nn.Module]) -> type[nn.Module]:
    """``base`` (a registered ``*ForCausalLM``) as a sequence classifier named
    ``*ForSequenceClassification`` (module docstring)."""

    def __init__(self, arch: ModelArchConfig, attn_backend: AttentionBackend | None = None):
        base.__init__(self, arch, attn_backend)
        self._init_head(arch)

    name = base.__name__.replace("ForCausalLM", "ForSequenceClassification")
    return type(name, (_SequenceClassifier, base), {"__init__": __init__, "__doc__": f"{base.__name__} with a "
                                                    "``score`` head on the last token (kvserve.model.seq_cls)."})
