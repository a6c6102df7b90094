"""The offline API of pooling models, vLLM's: ``LLM(model, runner="pooling").embed(prompts)``,
``LLM.encode(prompts, pooling_task="embed")``, a classifier's ``LLM.classify(prompts)`` and
``LLM.score(queries, documents)`` (a cross-encoder's or reranker's scores, or an embedding
model's cosine similarities: ``kvserve.pooling.scoring``).

Each prompt (each scored pair, or each text of a bi-encoder) is one pooling request
(``InputProcessor.process_pooling``: every check, as over HTTP); all of them are admitted together,
run through the scheduler (batched, whole prompts) and come back in prompt order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvserve.outputs import (ClassificationRequestOutput, EmbeddingRequestOutput, PoolingRequestOutput, ScoringOutput,
                             ScoringRequestOutput)
from kvserve.pooling.params import PoolingParams
from kvserve.pooling.score_inputs import TextPair
from kvserve.pooling.scoring import ScoreOptions, pair_scores, plan_scoring

PromptType = str | list[int] | dict[str, Any] | TextPair  # a TextPair: a cross-encoder's (query, document)


class PoolingMixin:
    """``embed``, ``classify``, ``score`` and ``encode`` of ``kvserve.engine.llm.LLM`` (which
    provides ``llm_engine``, ``_ids``, ``_as_list``)."""

    def embed(self, prompts: PromptType | Sequence[PromptType], pooling_params: PoolingParams | Sequence[PoolingParams]
              | None = None, *, truncate_prompt_tokens: int | None = None, use_tqdm: bool | Callable = True,
              lora_request: Any = None, tokenization_kwargs: dict[str, Any] | None = None) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (a string, token ids, or ``{"prompt_token_ids": [...]}`` /
        ``{"prompt": ..., "add_special_tokens": ...}``), in prompt order: each result's
        ``outputs.embedding`` (list of floats), ``prompt_token_ids``, ``request_id``.

        Args:
            pooling_params: one for every prompt or one per prompt (None: the model's defaults).
            truncate_prompt_tokens: keep at most this many tokens per prompt (-1: the context);
                also ``tokenization_kwargs={"truncate_prompt_tokens": N, "truncation_side": ...}``
                as vLLM 0.32 spells it.
            use_tqdm: a progress bar over the finished prompts (True, False, or a tqdm factory).
            lora_request: must be None (pooling runs the base model).

        Raises:
            InvalidRequestError: a generative model (start it with ``runner="pooling"``), or an
                invalid prompt or parameter (nothing is run then).
            RequestRejectedError: more prompts than the waiting queue takes (nothing is run).
        """
        return [EmbeddingRequestOutput.from_base(o) for o in self.encode(
            prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm,
            lora_request=lora_request, pooling_task="embed", tokenization_kwargs=tokenization_kwargs)]

    def classify(self, prompts: PromptType | Sequence[PromptType], pooling_params: PoolingParams
                 | Sequence[PoolingParams] | None = None, *, truncate_prompt_tokens: int | None = None,
                 use_tqdm: bool | Callable = True, lora_request: Any = None,
                 tokenization_kwargs: dict[str, Any] | None = None) -> list[ClassificationRequestOutput]:
        """A sequence classifier's probabilities per prompt (``outputs.probs``: softmax over the
        labels, or the sigmoid of one; logits with ``PoolingParams(use_activation=False)``), in
        prompt order; the arguments as :meth:`embed`'s.

        Raises:
            InvalidRequestError: a generative or embedding model (vLLM's words), or an invalid
                prompt or parameter (nothing is run then).
            RequestRejectedError: more prompts than the waiting queue takes (nothing is run).
        """
        return [ClassificationRequestOutput.from_base(o) for o in self.encode(
            prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm,
            lora_request=lora_request, pooling_task="classify", tokenization_kwargs=tokenization_kwargs)]

    def score(self, data_1: str | Sequence[str], data_2: str | Sequence[str], /, *,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool | Callable = True,
              pooling_params: PoolingParams | None = None, lora_request: Any = None,
              tokenization_kwargs: dict[str, Any] | None = None, chat_template: str | None = None
              ) -> list[ScoringRequestOutput]:
        """vLLM's ``LLM.score``: a score per (``data_1``, ``data_2``) pair, 1:1, 1:N or N:N, in
        pair order (``outputs.score``). A cross-encoder (a classifier of one label) scores each
        pair as one prompt (``tokenizer(query, document)``, or ``query + document`` for an LLM
        reranker, or ``chat_template`` over the query and document roles); an embedding model
        scores the cosine of the two texts' embeddings.

        Raises:
            InvalidRequestError: a generative model, a classifier of several labels, the pairing
                rules (vLLM's words), an invalid text or parameter (nothing is run then).
            ValueError: ``pooling_params.task`` other than the scoring task.
            RequestRejectedError: more prompts than the waiting queue takes (nothing is run).
        """
        processor = self.llm_engine.input_processor
        kind = processor.check_scores()
        classifier = processor.pooler_config.classifier
        plan = plan_scoring(kind, list(data_1) if isinstance(data_1, tuple) else data_1,
                            list(data_2) if isinstance(data_2, tuple) else data_2, classifier=classifier,
                            tokenizer=processor.tokenizer, max_model_len=processor.max_model_len,
                            options=ScoreOptions(chat_template=chat_template))
        params = PoolingParams() if pooling_params is None else pooling_params
        if not isinstance(params, PoolingParams):
            raise TypeError(f"pooling_params must be a PoolingParams (one for every pair), got "
                            f"{type(params).__name__}")
        if params.task not in (None, plan.task):
            raise ValueError(f"You cannot overwrite pooling_params.task={params.task!r} with "
                             f"pooling_task={plan.task!r}!")
        outputs = self.encode(plan.prompts, params, truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm,
                              lora_request=lora_request, pooling_task=plan.task,
                              tokenization_kwargs=tokenization_kwargs)
        pad = getattr(processor.tokenizer, "pad_token_id", None)
        return [ScoringRequestOutput(s.request_id, ScoringOutput(s.score), s.prompt_token_ids, s.num_cached_tokens,
                                     True, s.error) for s in pair_scores(plan, outputs, pad)]

    def encode(self, prompts: PromptType | Sequence[PromptType], pooling_params: PoolingParams
               | Sequence[PoolingParams] | None = None, *, truncate_prompt_tokens: int | None = None,
               use_tqdm: bool | Callable = True, lora_request: Any = None, pooling_task: str | None = None,
               tokenization_kwargs: dict[str, Any] | None = None) -> list[PoolingRequestOutput]:
        """vLLM's ``LLM.encode``: each prompt's ``PoolingRequestOutput`` (``outputs.data``: a
        float32 tensor), in prompt order. ``pooling_task`` is required, as in vLLM (``embed``).

        Raises:
            ValueError: no ``pooling_task``, or a ``tokenization_kwargs`` key other than
                ``truncate_prompt_tokens`` / ``truncation_side``.
            InvalidRequestError, RequestRejectedError: as :meth:`embed`.
        """
        if pooling_task is None:
            raise ValueError("pooling_task required for `LLM.encode`: use `LLM.embed(...)` or pooling_task=\"embed\"")
        prompt_list = [prompts] if isinstance(prompts, TextPair) else self._as_list(prompts)
        params_list = _params_list(pooling_params, len(prompt_list), pooling_task,
                                   _truncation(truncate_prompt_tokens, tokenization_kwargs))
        engine = self.llm_engine
        lora = lora_request if not isinstance(lora_request, (list, tuple)) else next(filter(None, lora_request), None)
        requests = [engine.input_processor.process_pooling(str(next(self._ids)), prompt, params, lora_request=lora)
                    for prompt, params in zip(prompt_list, params_list)]
        engine.add_requests(requests)
        return self._run_pooling([r.request_id for r in requests], use_tqdm)

    def _run_pooling(self, ids: list[str], use_tqdm: bool | Callable) -> list[PoolingRequestOutput]:
        engine = self.llm_engine
        finals: dict[str, PoolingRequestOutput] = {}
        bar = _progress(use_tqdm, len(ids))
        while len(finals) < len(ids):
            for output in engine.step().outputs:
                if output.finished:
                    finals[output.request_id] = output
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [finals[i] for i in ids]


def _truncation(truncate_prompt_tokens: int | None, tokenization_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The truncation fields ``embed``/``encode`` lay over each prompt's ``PoolingParams``."""
    kwargs = dict(tokenization_kwargs or {})
    unknown = sorted(set(kwargs) - {"truncate_prompt_tokens", "truncation_side"})
    if unknown:
        raise ValueError(f"tokenization_kwargs {unknown} are not supported; accepted: truncate_prompt_tokens, "
                         "truncation_side")
    if truncate_prompt_tokens is not None:
        kwargs["truncate_prompt_tokens"] = truncate_prompt_tokens
    return kwargs


def _params_list(params, count: int, task: str, truncation: dict[str, Any]) -> list[PoolingParams]:
    import dataclasses

    if params is None or isinstance(params, PoolingParams):
        params = [params or PoolingParams()] * count
    elif len(params) != count:
        raise ValueError(f"got {len(params)} PoolingParams for {count} prompts")
    return [dataclasses.replace(p, task=p.task or task, **truncation) if isinstance(p, PoolingParams) else p
            for p in params]


def _progress(use_tqdm: bool | Callable, total: int):
    """A tqdm bar (``use_tqdm`` True, or a factory like ``functools.partial(tqdm, leave=False)``),
    or None."""
    if not use_tqdm:
        return None
    from tqdm.auto import tqdm

    factory = use_tqdm if callable(use_tqdm) else tqdm
    return factory(total=total, desc="Processed prompts", dynamic_ncols=True)
