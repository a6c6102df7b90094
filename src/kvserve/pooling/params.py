"""``PoolingParams``: what a pooling request asks of the model (vLLM 0.32's names and meanings).

A pooling request is a prompt-only engine request (``SamplingParams.max_tokens == 0``) that
carries these parameters on its ``EngineRequest``: the runner pools the final hidden states of
its prompt when the prompt's one step completes (``kvserve.pooling.pooler``) and the request
finishes with the vector instead of tokens.

Construction only stores the values; the engine's input processor checks them
(``kvserve.pooling.validation``) and stores the resolved copy (``task`` and ``use_activation``
filled from the model's ``PoolerConfig``) on the request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

PoolingTask = Literal["embed", "classify"]
POOLING_TASKS: tuple[str, ...] = ("embed", "classify")
# Tasks vLLM names that kvserve does not run: token-level outputs and plugins (refused by name).
UNSUPPORTED_TASKS = ("token_embed", "token_classify", "plugin", "embed&token_classify")
# Tasks vLLM removed, with vLLM's words (``vllm.tasks.check_removed_pooling_task``).
REMOVED_TASKS = {
    "score": "`score` task was removed; use `classify` instead.",
    "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead.",
}


@dataclass(frozen=True)
class PoolingParams:
    """Attributes:
        task: ``embed`` (one vector per prompt) or ``classify`` (a classifier head's scores);
            None = the model's task (``PoolerConfig.task``).
        use_activation: ``embed``: L2-normalise the vector; ``classify``: the head's activation
            (sigmoid for one label, softmax for more). None = the model's default (a
            sentence-transformers ``Normalize`` module, else True), as vLLM.
        dimensions: keep the first ``dimensions`` values of an embedding before normalising
            (Matryoshka representation learning, Kusupati et al. 2022); only for models that
            declare it (``is_matryoshka`` / ``matryoshka_dimensions`` in config.json).
        truncate_prompt_tokens: keep at most this many prompt tokens (-1: ``max_model_len``);
            None = the whole prompt, which must fit the context.
        truncation_side: ``left`` keeps the last tokens, ``right`` the first; None = the
            tokenizer's ``truncation_side`` (vLLM 0.32's ``TokenizeParams``). A text prompt
            truncated on the tokenizer's own side keeps its special tokens (the tokenizer cuts
            it), as vLLM.
    """

    task: PoolingTask | None = None
    use_activation: bool | None = None
    dimensions: int | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None

    def resolved(self, task: str, use_activation: bool) -> PoolingParams:
        """A copy with ``task`` and ``use_activation`` filled where they are None."""
        return dataclasses.replace(self, task=self.task or task,
                                   use_activation=use_activation if self.use_activation is None else self.use_activation)
