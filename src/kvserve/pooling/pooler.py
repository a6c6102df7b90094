"""The pooler: a prompt's final hidden states (after the model's final norm) -> its output vector.

    hidden [T, H] (model dtype, a step's flat batch)
      │  the request's rows hidden[start:end] (its whole prompt: pooling requests are never chunked)
      ▼
    CLS: row 0 | MEAN: float32 sum of the rows / their count | LAST: the last row      -> float32 [H]
      │  embed: first ``dimensions`` values (Matryoshka), then L2-normalised when use_activation
      │  classify: the model's head (``classify``, float32) -> logits [num_labels], then when
      │            use_activation the classifier's activation: sigmoid for one label, softmax
      │            over several (or each label's sigmoid, or none: ``ClassifierConfig.activation``)
      ▼
    float32 [H'] / [num_labels] on the CPU

Each request is pooled alone, on a fresh copy of its rows, so its vector does not depend on the
other requests of the step (batch invariance: the same bits alone or batched). Method after vLLM
0.32's ``vllm/model_executor/layers/pooler/seqwise`` (``CLSPool``, ``MeanPool``, ``LastPool``,
``EmbeddingPoolerHead``: dimensions are cut before the normalisation; ``ClassifierPoolerHead``,
``activations.PoolerClassify``) and sentence-transformers' ``Pooling`` / ``Normalize`` modules
(``F.normalize``, eps 1e-12).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kvserve.pooling.config import PoolerConfig
from kvserve.pooling.params import PoolingParams


ClassifierHead = Callable[[torch.Tensor], torch.Tensor]  # pooled float32 [H] -> float32 logits [num_labels]


class Pooler:
    """Pools each request of a step alone (module docstring).

    Args:
        config: the model's pooling (``PoolerConfig``).
        head: a ``classify`` model's head (the model's ``classify`` method), else None.

    Raises:
        ValueError: a ``classify`` config without a head.
    """

    def __init__(self, config: PoolerConfig, head: ClassifierHead | None = None):
        if config.task == "classify" and head is None:
            raise ValueError("a classify pooler needs the model's classifier head (its `classify` method)")
        self.config = config
        self.head = head

    def __call__(self, hidden: torch.Tensor, spans: list[tuple[int, int]],
                 params: list[PoolingParams]) -> list[torch.Tensor]:
        """Args:
            hidden: [T, H] final hidden states of the step's tokens.
            spans: per pooled request, its rows ``[start, end)`` of ``hidden``: its whole prompt.
            params: per pooled request, its resolved ``PoolingParams`` (the model's task).

        Returns:
            per request a float32 CPU tensor [H] (or [dimensions]); classify: [num_labels].
        """
        return [self.pool_one(hidden[start:end], p) for (start, end), p in zip(spans, params, strict=True)]

    @staticmethod
    def requests_to_pool(specs: list[Any], completes: np.ndarray, num_computed: np.ndarray,
                         query_start_loc: np.ndarray) -> tuple[list[str], list[tuple[int, int]], list[PoolingParams]]:
        """Which of a step's requests pool now: the pooling requests (``spec.pooling_params``)
        whose prompt completes in it. ``specs``, ``completes`` (bool), ``num_computed`` (tokens
        computed before the step): per request of the flat batch; ``query_start_loc``: [B + 1].

        Returns:
            (request ids, their ``[start, end)`` rows of the step's hidden states, their params).

        Raises:
            ValueError: a pooling request computed part of its prompt in an earlier step (pooling
                requests are never chunked: a scheduler bug, which fails that request alone).
        """
        req_ids, spans, params = [], [], []
        for i, spec in enumerate(specs):
            if spec.pooling_params is None or not completes[i]:
                continue
            if num_computed[i] != 0:
                raise ValueError(f"pooling request {spec.request_id} computed {num_computed[i]} of its prompt tokens "
                                 "in an earlier step; pooling requests run whole (a scheduler bug)")
            req_ids.append(spec.request_id)
            spans.append((int(query_start_loc[i]), int(query_start_loc[i + 1])))
            params.append(spec.pooling_params)
        return req_ids, spans, params

    def pool_one(self, states: torch.Tensor, params: PoolingParams) -> torch.Tensor:
        """One request: ``states`` [n, H] -> float32 [H'] (classify: [num_labels]) on the CPU."""
        pooled = self._pool_states(states)
        if self.config.task == "classify":
            logits = self.head(pooled).to(torch.float32)
            return (_activate(logits, self.config.classifier.activation) if params.use_activation else logits).cpu()
        if params.dimensions is not None:
            pooled = pooled[: params.dimensions]
        if params.use_activation:
            pooled = F.normalize(pooled, p=2.0, dim=0)
        return pooled.cpu()

    def _pool_states(self, states: torch.Tensor) -> torch.Tensor:
        """float32 [H], computed on a copy of the request's own rows."""
        kind = self.config.pooling_type
        if kind == "CLS":
            return states[0].to(torch.float32, copy=True)
        if kind == "LAST":
            return states[-1].to(torch.float32, copy=True)
        rows = states.to(torch.float32, copy=True)
        return rows.sum(dim=0) / rows.shape[0]


def _activate(logits: torch.Tensor, activation: str) -> torch.Tensor:
    """vLLM's classifier activations on logits [num_labels]: ``classify`` (sigmoid for one label,
    softmax for more), ``sigmoid``, ``identity``."""
    if activation == "identity":
        return logits
    if activation == "sigmoid" or logits.shape[-1] < 2:
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)
