"""The checks of a pooling request, made once by the engine's input processor
(``InputProcessor.process_pooling``), with vLLM 0.32's rules and words where vLLM has them:
``PoolingParams`` against the model's ``PoolerConfig`` (``vllm/pooling_params.py``), and the
prompt's truncation and length (``vllm/renderers/params.py`` ``TokenizeParams``).

The same request gets the same refusal over HTTP (``/v1/embeddings``, ``/pooling``, ``/classify``,
``/score``, ``/rerank``) and offline (``LLM.embed``, ``LLM.encode``, ``LLM.classify``, ``LLM.score``).
"""

from __future__ import annotations

from typing import Any

from kvserve.errors import InvalidRequestError
from kvserve.pooling.config import PoolerConfig
from kvserve.pooling.params import POOLING_TASKS, REMOVED_TASKS, PoolingParams

GENERATION_REFUSAL = ("This model is a pooling model (it runs with --runner pooling): it computes embeddings or "
                      "scores (/v1/embeddings, /pooling, /classify, /score, /rerank; LLM.embed, LLM.classify, "
                      "LLM.score offline) and generates no text. Start it with --runner generate to generate, if it "
                      "is a generative model.")


def pooling_refusal(api: str) -> str:
    """What a generative model answers a pooling request of ``api`` (``embeddings``, ``Score``,
    ``Classification``)."""
    return (f"This model does not support the {api} API: it runs as a generative model. Try passing "
            "`--runner pooling` to use the model as a pooling model.")


# vLLM's words when a pooling model is asked for the other pooling task (LLM._verify_pooling_task).
_TASK_HINTS = {"embed": "Embedding API is not supported by this model. Try converting the model using "
                        "`--convert embed`.",
               "classify": "Classification API is not supported by this model. Try converting the model using "
                           "`--convert classify`."}


def score_type(pooler: PoolerConfig) -> str:
    """How this pooling model scores a pair: ``cross-encoder`` (a classifier of one label) or
    ``bi-encoder`` (the cosine of two embeddings), as vLLM's ``SCORE_TYPE_MAP``.

    Raises:
        InvalidRequestError: a classifier of more than one label (``model``; vLLM's words).
    """
    if pooler.task == "embed":
        return "bi-encoder"
    if pooler.classifier is None or pooler.classifier.num_labels != 1:
        raise InvalidRequestError("Scoring API is only enabled for num_labels == 1.", param="model")
    return "cross-encoder"


def check_pooling_params(params: PoolingParams, pooler: PoolerConfig, max_model_len: int) -> PoolingParams:
    """``params`` checked against the model and resolved (``task``, ``use_activation`` filled).

    Raises:
        InvalidRequestError: ``param`` names the field: a task the model does not run, a
            ``use_activation`` that is not a boolean, ``dimensions`` on a model without
            Matryoshka embeddings or out of its range, a ``truncate_prompt_tokens`` that is not
            -1 or in [1, max_model_len], an unknown ``truncation_side``.
    """
    if not isinstance(params, PoolingParams):
        raise InvalidRequestError(f"pooling_params must be a PoolingParams, got {type(params).__name__}",
                                  param="pooling_params")
    _check_task(params.task, pooler)
    if params.use_activation is not None and not isinstance(params.use_activation, bool):
        raise InvalidRequestError(f"use_activation must be true, false or null, got {params.use_activation!r}",
                                  param="use_activation")
    if params.dimensions is not None:
        _check_dimensions(params.dimensions, pooler)
    _check_truncation(params, max_model_len)
    return params.resolved(pooler.task, pooler.use_activation)


def _check_task(task: Any, pooler: PoolerConfig) -> None:
    if task is None or task == pooler.task:
        return
    if task in REMOVED_TASKS:
        raise InvalidRequestError(REMOVED_TASKS[task], param="task")
    if task in POOLING_TASKS:
        raise InvalidRequestError(f"Unsupported task: {task!r}. Supported tasks: ('{pooler.task}',). "
                                  f"{_TASK_HINTS.get(task, '')}".rstrip(), param="task")
    raise InvalidRequestError(f"task {task!r} is not supported; this model runs the {pooler.task!r} task",
                              param="task")


def _check_dimensions(dimensions: Any, pooler: PoolerConfig) -> None:
    """vLLM's ``PoolingParams._set_default_parameters`` checks, in its words."""
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise InvalidRequestError(f"dimensions must be an integer, got {dimensions!r}", param="dimensions")
    if pooler.task != "embed":
        raise InvalidRequestError(f"Task {pooler.task!r} only supports ['use_activation'] parameters, does not "
                                  "support ['dimensions'] parameters", param="dimensions")
    if not pooler.is_matryoshka:
        raise InvalidRequestError("This model does not support Matryoshka embeddings; dimensions must be unset "
                                  f"(received dimensions={dimensions}).", param="dimensions")
    if not 1 <= dimensions <= pooler.hidden_size:
        raise InvalidRequestError(f"This model only supports dimensions in range [1, {pooler.hidden_size}], got "
                                  f"{dimensions}.", param="dimensions")
    listed = pooler.matryoshka_dimensions
    if listed is not None and dimensions not in listed:
        raise InvalidRequestError(f"This model only supports Matryoshka dimensions {list(listed)}, got {dimensions}.",
                                  param="dimensions")


def _check_truncation(params: PoolingParams, max_model_len: int) -> None:
    limit = params.truncate_prompt_tokens
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not (limit == -1 or limit >= 1)):
        raise InvalidRequestError(f"truncate_prompt_tokens must be an integer >= 1 (the number of prompt tokens to "
                                  f"keep) or -1 (the context length), got {limit!r}", param="truncate_prompt_tokens")
    if limit is not None and limit > max_model_len:
        raise InvalidRequestError(
            f"truncate_prompt_tokens ({limit}) is greater than the context length ({max_model_len} tokens); choose "
            "a smaller truncation", param="truncate_prompt_tokens")
    if params.truncation_side not in (None, "left", "right"):
        raise InvalidRequestError("`truncation_side` must be either 'left' or 'right'.", param="truncation_side")


def pooling_token_ids(tokenizer: Any, prompt: str | list[int], add_special_tokens: bool, params: PoolingParams,
                      max_model_len: int, do_lower_case: bool = False) -> list[int]:
    """A pooling prompt's token ids after truncation (vLLM 0.32's ``TokenizeParams``): a text
    truncated on the tokenizer's own side is cut by the tokenizer (special tokens kept); with an
    explicit ``truncation_side``, or token ids, the ids are sliced (``left`` keeps the last ones,
    ``right`` the first). ``do_lower_case`` (sentence-transformers) lower-cases text first."""
    limit = params.truncate_prompt_tokens
    limit = max_model_len if limit == -1 else limit
    if isinstance(prompt, str):
        text = prompt.lower() if do_lower_case else prompt
        if limit is not None and params.truncation_side is None:
            return list(tokenizer.encode(text, add_special_tokens=add_special_tokens, truncation=True,
                                         max_length=limit))
        prompt = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    if limit is None or len(prompt) <= limit:
        return list(prompt)
    side = params.truncation_side or getattr(tokenizer, "truncation_side", "right")
    return list(prompt[-limit:]) if side == "left" else list(prompt[:limit])


def check_prompt_fits(num_tokens: int, max_model_len: int, param: str) -> None:
    """Raises InvalidRequestError (vLLM's words) when a pooling prompt exceeds the context."""
    if num_tokens > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
            f"{num_tokens} input tokens, which exceeds this limit even without any output tokens. Please reduce "
            "the length of the input prompt.", param=param)
