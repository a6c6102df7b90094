"""The input processor: the one place a request is validated and normalised.

    prompt (text, token ids, or {"prompt"/"prompt_token_ids": ...}) + SamplingParams
        │  tokenize (text), check token ids, truncate (truncate_prompt_tokens)
        │  validate every sampling field (param_validation), n, priority, seed
        │  max_tokens against the context: 400 when prompt + cap do not fit (vLLM); none: the rest
        │  the model's EOS ids other than the tokenizer's join stop_token_ids (vLLM)
        │  tokenize bad_words; allowed_token_ids that bad_words / min_tokens leave empty: refused
        ▼
    EngineRequest  ──►  engine thread: queue capacity and KV fit only (the scheduler)

A pooling model's requests (embeddings, classifications, scored pairs) go through
:meth:`InputProcessor.process_pooling` instead (``kvserve.pooling.validation``: the pooling
parameters, truncation, the context; a cross-encoder's ``TextPair`` tokenized as a pair,
``kvserve.pooling.score_inputs``); each kind of model refuses the other kind of request here.

The HTTP API and the offline ``LLM`` both call :meth:`InputProcessor.process`, so the same bad
value gets the same error and message from both. The server runs it on a worker thread (the
handlers' input stage, ``kvserve.api.serving_chat`` / ``serving_completion``): tokenizing a long
prompt never blocks the event loop.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import Any

from kvserve.config import EngineConfig
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.param_validation import validate_sampling_params
from kvserve.errors import InvalidRequestError
from kvserve.lora.request import LoRARequest
from kvserve.pooling.config import PoolerConfig
from kvserve.pooling.params import PoolingParams
from kvserve.pooling.score_inputs import TextPair, pair_token_ids
from kvserve.pooling.validation import (GENERATION_REFUSAL, check_pooling_params, check_prompt_fits, pooling_refusal,
                                        pooling_token_ids, score_type)
from kvserve.sample.bad_words import tokenize_bad_words
from kvserve.sampling_params import SamplingParams
from kvserve.slo.targets import SLOTarget
from kvserve.structured_output.grammar_request import GrammarRequest
from kvserve.structured_output.manager import StructuredOutputManager
from kvserve.tokenizer import eos_token_ids, require_valid_unicode

PromptInput = str | list[int] | dict[str, Any] | TextPair


@dataclass(frozen=True)
class FieldNames:
    """How the caller's API names the prompt, the output cap and the logprobs count, for error
    messages (chat says ``messages``, ``top_logprobs`` and may say ``max_completion_tokens``)."""

    prompt: str = "prompt"
    max_tokens: str = "max_tokens"
    logprobs: str = "logprobs"

    def renamed(self, exc: InvalidRequestError) -> InvalidRequestError:
        """``exc`` with its field named as this API names it."""
        names = {"prompt": self.prompt, "max_tokens": self.max_tokens, "logprobs": self.logprobs}
        new = names.get(exc.param)
        if new is None or new == exc.param:
            return exc
        return InvalidRequestError(exc.message.replace(exc.param, new, 1), param=new)


DEFAULT_FIELDS = FieldNames()


def build_input_processor(config: EngineConfig, tokenizer: Any, vocab_size: int, max_model_len: int,
                          build_backend_now: bool = False) -> InputProcessor:
    """The input processor of a model, with its structured-output backend (built in the
    background from now on with ``build_backend_now``, else at the first constrained request); a
    pooling model's (``kvserve.pooling.config.resolve_pooler_config``) has its ``PoolerConfig``
    and no structured outputs."""
    from kvserve.pooling.config import resolve_pooler_config

    eos = eos_token_ids(config.model.model, tokenizer)
    pooler = resolve_pooler_config(config.model)
    structured = None if pooler is not None else StructuredOutputManager(
        tokenizer, vocab_size, eos, config.structured_outputs, build_now=build_backend_now)
    return InputProcessor(tokenizer, vocab_size, max_model_len, eos,
                          priority_scheduling=config.scheduler.policy == "priority",
                          lora_enabled=config.lora is not None, structured_outputs=structured,
                          pooler_config=pooler)


class InputProcessor:
    """Args:
    tokenizer: the model's tokenizer (text prompts are encoded with its special tokens, e.g. BOS).
    vocab_size: model vocabulary size (token ids must be below it).
    max_model_len: context length in tokens.
    eos_token_ids: every id that ends generation unless ``ignore_eos`` (the tokenizer's
        ``eos_token_id`` and the model's others, see ``_stop_token_ids``).
    max_n: largest ``n`` accepted.
    priority_scheduling: whether the scheduler orders by ``priority`` (else a non-zero priority
        is refused, as vLLM does, rather than silently ignored).
    structured_outputs: compiles ``structured_outputs`` constraints (None: such requests are
        refused).
    lora_enabled: whether requests may carry a ``LoRARequest`` (``--enable-lora``).
    pooler_config: a pooling model's ``PoolerConfig``: it takes only pooling requests
        (:meth:`process_pooling`); None = a generative model, which takes only generation ones.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int, eos_token_ids: frozenset[int],
                 max_n: int = 128, priority_scheduling: bool = False,
                 structured_outputs: StructuredOutputManager | None = None, lora_enabled: bool = False,
                 pooler_config: PoolerConfig | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_n = max_n
        self.priority_scheduling = priority_scheduling
        self.structured_outputs = structured_outputs
        self.lora_enabled = lora_enabled
        self.pooler_config = pooler_config

    def check_generates(self) -> None:
        """Raises InvalidRequestError (``model``) when this is a pooling model: it generates no
        text. The API calls it first thing for every generation endpoint."""
        if self.pooler_config is not None:
            raise InvalidRequestError(GENERATION_REFUSAL, param="model")

    def check_pools(self, api: str = "embeddings") -> None:
        """Raises InvalidRequestError (``model``) when this is a generative model: it computes no
        embeddings or scores (start it with ``--runner pooling``); ``api`` names the refused API."""
        if self.pooler_config is None:
            raise InvalidRequestError(pooling_refusal(api), param="model")

    def check_scores(self) -> str:
        """How this model scores a (query, document) pair: ``cross-encoder`` or ``bi-encoder``
        (``kvserve.pooling.validation.score_type``).

        Raises:
            InvalidRequestError: a generative model, or a classifier of more than one label
                (``model``).
        """
        self.check_pools("Score")
        return score_type(self.pooler_config)

    def process_pooling(self, request_id: str, prompt: PromptInput, params: PoolingParams, *, priority: int = 0,
                        arrival_time: float | None = None, fields: FieldNames = DEFAULT_FIELDS,
                        lora_request: LoRARequest | None = None) -> EngineRequest:
        """Validate and normalise one pooling request (``kvserve.pooling.validation``): the
        pooling parameters against the model, the prompt (text tokenized with its special tokens
        unless ``{"prompt": ..., "add_special_tokens": False}``, token ids, or a cross-encoder's
        ``TextPair`` tokenized as a pair with its segment ids), its truncation and length. The
        request computes its prompt (``max_tokens`` 0) and finishes with a vector.

        Raises:
            InvalidRequestError: a generative model (``model``), or any invalid value (``param``
                names the field as ``fields`` calls it).
        """
        self.check_pools()
        pooler = self.pooler_config
        if lora_request is not None:
            raise InvalidRequestError(f"LoRA adapter {lora_request.lora_name!r}: pooling runs the base model only",
                                      param="model")
        resolved = check_pooling_params(params, pooler, self.max_model_len)
        self._check_call(SamplingParams(), priority, None)
        if isinstance(prompt, TextPair):
            text, (token_ids, token_type_start) = None, self._pair_prompt(prompt, resolved, fields.prompt)
        else:
            (text, token_ids), token_type_start = self._pooling_prompt(prompt, resolved, fields.prompt), None
        if not token_ids:
            raise InvalidRequestError("the prompt is empty; at least 1 token is required", param=fields.prompt)
        check_prompt_fits(len(token_ids), self.max_model_len, fields.prompt)
        return EngineRequest(request_id=request_id, prompt=text, prompt_token_ids=token_ids,
                             sampling_params=SamplingParams(max_tokens=0), eos_token_ids=frozenset(),
                             bad_words_token_ids=[], priority=priority, cache_salt=None,
                             arrival_time=time.time() if arrival_time is None else arrival_time,
                             pooling_params=resolved, token_type_start=token_type_start)

    def _pair_prompt(self, pair: TextPair, params: PoolingParams, param: str) -> tuple[list[int], int | None]:
        """(token ids after truncation, where segment type 1 starts) of a cross-encoder pair."""
        for text in pair:
            if not isinstance(text, str):
                raise InvalidRequestError(f"{param} must be text, got {type(text).__name__}", param=param)
            require_valid_unicode(text, param)
        if not (pair.text or pair.text_pair):
            raise InvalidRequestError("Either prompt or prompt_embeds must be provided and non-empty.", param=param)
        self._check_prompt_chars(pair.text + pair.text_pair,
                                 SamplingParams(truncate_prompt_tokens=params.truncate_prompt_tokens), param)
        return pair_token_ids(self.tokenizer, pair, params, self.max_model_len, self.pooler_config.token_types)

    def _pooling_prompt(self, prompt: PromptInput, params: PoolingParams, param: str) -> tuple[str | None, list[int]]:
        """(text or None, token ids after truncation) of a pooling prompt."""
        self._check_prompt_chars(prompt, SamplingParams(truncate_prompt_tokens=params.truncate_prompt_tokens), param)
        add_special_tokens = True
        if isinstance(prompt, dict):
            add_special_tokens = bool(prompt.get("add_special_tokens", True))
            prompt = prompt["prompt_token_ids"] if "prompt_token_ids" in prompt else prompt.get("prompt")
        if prompt == "":
            raise InvalidRequestError("Either prompt or prompt_embeds must be provided and non-empty.", param=param)
        if isinstance(prompt, str):
            require_valid_unicode(prompt, param)
        elif isinstance(prompt, (list, tuple)):
            prompt = self._checked_ids(prompt, param)
        else:
            raise InvalidRequestError(f"{param} must be text or a list of token ids, got {type(prompt).__name__}",
                                      param=param)
        token_ids = pooling_token_ids(self.tokenizer, prompt, add_special_tokens, params, self.max_model_len,
                                      self.pooler_config.do_lower_case)
        text = prompt if isinstance(prompt, str) and params.truncate_prompt_tokens is None else None
        return text, token_ids

    def process(self, request_id: str, prompt: PromptInput, params: SamplingParams, *, priority: int = 0,
                cache_salt: str | None = None, arrival_time: float | None = None,
                fields: FieldNames = DEFAULT_FIELDS, reasoning: Any = None,
                lora_request: LoRARequest | None = None, slo: SLOTarget | None = None) -> EngineRequest:
        """Validate and normalise one prompt's request (see the module docstring). A
        ``structured_outputs`` constraint is compiled here (cached; blocking, so never on the
        event loop or the engine thread); with a ``reasoning`` parser it applies only after the
        model's reasoning ends. ``lora_request``: the adapter to run with (its folder was checked
        when it was registered), or None. ``slo``: the request's latency targets (already checked,
        ``kvserve.slo.targets``), or None.

        Raises:
            InvalidRequestError: any invalid value; ``param`` names the field (as ``fields`` calls
                it) and the message says what is allowed (``StructuredOutputError`` for a
                constraint the grammar backend refuses).
        """
        self.check_generates()
        try:
            validate_sampling_params(params, self.vocab_size)
        except InvalidRequestError as exc:
            raise fields.renamed(exc) from None
        self._check_call(params, priority, cache_salt)
        if params.logit_bias:  # vLLM clamps every bias to [-100, 100]
            params = replace(params, logit_bias={t: min(100.0, max(-100.0, float(b))) for t, b in params.logit_bias.items()})
        if lora_request is not None and not self.lora_enabled:
            raise InvalidRequestError(f"LoRA adapter {lora_request.lora_name!r} asked for, but this engine serves "
                                      "no adapters (start it with --enable-lora)", param="model")
        self._check_prompt_chars(prompt, params, fields.prompt)
        text, token_ids = self._prompt_token_ids(prompt, fields.prompt)
        kept = params.truncated_prompt(token_ids, self.max_model_len)
        if len(kept) < len(token_ids):
            text, token_ids = None, kept  # the text no longer matches the tokens
        if not token_ids:
            raise InvalidRequestError("the prompt is empty; at least 1 token is required", param=fields.prompt)
        max_tokens = self._resolve_max_tokens(len(token_ids), params, fields)
        eos_token_ids, stop_token_ids = self._stop_token_ids(params)
        bad_words_token_ids = tokenize_bad_words(self.tokenizer, params.bad_words, self.vocab_size)
        if max_tokens > 0:
            _check_allowed_tokens_left(params, eos_token_ids | set(stop_token_ids), bad_words_token_ids)
        return EngineRequest(
            request_id=request_id,
            prompt=text,
            prompt_token_ids=token_ids,
            sampling_params=replace(params, max_tokens=max_tokens, stop_token_ids=stop_token_ids),
            eos_token_ids=eos_token_ids,
            bad_words_token_ids=bad_words_token_ids,
            priority=priority,
            cache_salt=cache_salt,
            arrival_time=time.time() if arrival_time is None else arrival_time,
            grammar=self._grammar(params, reasoning),
            lora_request=lora_request,
            slo=slo,
        )

    def _grammar(self, params: SamplingParams, reasoning: Any) -> GrammarRequest | None:
        if params.structured_outputs is None:
            return None
        if self.structured_outputs is None:
            raise InvalidRequestError("structured outputs are not enabled on this engine",
                                      param=params.structured_outputs.source)
        return GrammarRequest(self.structured_outputs.compile(params.structured_outputs), reasoning,
                              self.structured_outputs.closing_alphabet)

    def _check_call(self, params: SamplingParams, priority: int, cache_salt: str | None) -> None:
        if params.n > self.max_n:
            raise InvalidRequestError(f"n must be at most {self.max_n}, got {params.n}", param="n")
        limit = params.truncate_prompt_tokens
        if limit is not None and limit > self.max_model_len:
            raise InvalidRequestError(
                f"truncate_prompt_tokens ({limit}) is greater than the context length ({self.max_model_len} "
                "tokens); choose a smaller truncation", param="truncate_prompt_tokens")
        if priority != 0 and not self.priority_scheduling:
            raise InvalidRequestError(
                f"priority {priority} needs priority scheduling, which this server does not use "
                "(start it with --scheduling-policy priority); omit priority or send 0", param="priority")
        if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
            raise InvalidRequestError("cache_salt must be a non-empty string", param="cache_salt")

    def _check_prompt_chars(self, prompt: PromptInput, params: SamplingParams, param: str) -> None:
        """Refuse, before tokenizing it, a text longer than the context could hold in tokens of the
        vocabulary's longest piece (vLLM's pre-check): a 20 MB prompt costs no 40 s of tokenizing.
        A prompt to be truncated (``truncate_prompt_tokens``) is tokenized whole."""
        text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
        if not isinstance(text, str) or params.truncate_prompt_tokens is not None:
            return
        limit = self.max_model_len * self._max_token_chars
        if len(text) > limit:
            raise InvalidRequestError(
                f"You passed {len(text)} input characters. However, the model's context length is only "
                f"{self.max_model_len} tokens (at most {limit} characters). Please reduce the length of the input "
                "prompt.", param=param)

    @functools.cached_property
    def _max_token_chars(self) -> int:
        """The most characters one token of the vocabulary spells (its longest piece)."""
        vocab = self.tokenizer.get_vocab() if hasattr(self.tokenizer, "get_vocab") else {}
        return max((len(piece) for piece in vocab), default=64) or 64

    def _prompt_token_ids(self, prompt: PromptInput, param: str) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of a prompt given as text, ids, or vLLM's prompt dicts
        (``{"prompt_token_ids": [...]}``, ``{"prompt": "...", "add_special_tokens": bool}``)."""
        add_special_tokens = True
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self._checked_ids(prompt["prompt_token_ids"], param)
            add_special_tokens = bool(prompt.get("add_special_tokens", True))
            prompt = prompt.get("prompt")
        if prompt == "":  # vLLM's check and words (a tokenizer with BOS would make it one token)
            raise InvalidRequestError("Either prompt or prompt_embeds must be provided and non-empty.", param=param)
        if isinstance(prompt, str):
            require_valid_unicode(prompt, param)
            return prompt, list(self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
        if isinstance(prompt, (list, tuple)):
            return None, self._checked_ids(prompt, param)
        raise InvalidRequestError(f"{param} must be text or a list of token ids, got {type(prompt).__name__}",
                                  param=param)

    def _checked_ids(self, token_ids: list[int], param: str) -> list[int]:
        for token in token_ids:
            if isinstance(token, bool) or not isinstance(token, int):
                raise InvalidRequestError(f"prompt token ids must be integers, got {token!r} "
                                          f"({type(token).__name__})", param=param)
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt token id {bad[0]!r} is outside the vocabulary (token ids are 0..{self.vocab_size - 1})",
                param=param)
        return list(token_ids)

    def _stop_token_ids(self, params: SamplingParams) -> tuple[frozenset[int], list[int]]:
        """(EOS ids, stop token ids) of a request, as vLLM's
        ``SamplingParams.update_from_generation_config`` sets them: the tokenizer's
        ``eos_token_id`` is *the* EOS (it finishes with ``stop_reason`` None); the model's other
        EOS ids (generation_config's, e.g. ``<|im_end|>``) join ``stop_token_ids`` (so they finish
        with ``stop_reason`` = the id) unless ``ignore_eos``. Under ``ignore_eos`` every EOS id is
        kept in the first set, only for ``min_tokens``, which bans them all either way."""
        if params.ignore_eos:
            return self.eos_token_ids, list(params.stop_token_ids)
        primary = getattr(self.tokenizer, "eos_token_id", None)
        eos = frozenset({primary}) if primary in self.eos_token_ids else frozenset()
        extra = sorted(self.eos_token_ids - eos - set(params.stop_token_ids))
        return eos, list(params.stop_token_ids) + extra

    def _resolve_max_tokens(self, num_prompt_tokens: int, params: SamplingParams, fields: FieldNames) -> int:
        """vLLM's rule: a requested cap must fit in the context with the prompt (else 400, in vLLM's
        words); without one (chat's default) the request may generate to the context's end.
        ``max_tokens == 0`` (prompt scoring) needs only the prompt to fit. ``min_tokens`` must
        fit under the cap the context leaves too.

        Raises:
            InvalidRequestError: the prompt and the cap do not fit, the prompt fills the context
                and leaves no room to generate, or it leaves less room than ``min_tokens``.
        """
        max_tokens = self._fit_max_tokens(num_prompt_tokens, params.max_tokens, fields)
        if params.min_tokens > max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({params.min_tokens}) must be <= max_tokens, which the context cuts to "
                f"{max_tokens} (a {num_prompt_tokens}-token prompt in a context of {self.max_model_len} "
                "tokens); lower min_tokens or shorten the prompt", param="min_tokens")
        return max_tokens

    def _fit_max_tokens(self, num_prompt_tokens: int, requested: int | None, fields: FieldNames) -> int:
        limit = self.max_model_len
        if requested is not None and requested > limit:
            raise InvalidRequestError(f"{fields.max_tokens}={requested} cannot be greater than max_model_len={limit}. "
                                      "Please request fewer output tokens.", param=fields.max_tokens)
        if requested == 0:
            if num_prompt_tokens > limit:
                raise InvalidRequestError(
                    f"This model's maximum context length is {limit} tokens. However, your prompt has "
                    f"{num_prompt_tokens} tokens. Please shorten the prompt.", param=fields.prompt)
            return 0
        if requested is not None and num_prompt_tokens + requested > limit:
            raise InvalidRequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested {requested} "
                f"output tokens and your prompt contains {num_prompt_tokens} input tokens, for a total of "
                f"{num_prompt_tokens + requested} tokens. Please reduce the length of the input prompt or the "
                "number of requested output tokens.", param=fields.prompt)
        if num_prompt_tokens >= limit:
            raise InvalidRequestError(
                f"This model's maximum context length is {limit} tokens. However, your prompt has "
                f"{num_prompt_tokens} tokens, which leaves no room for output. Please shorten the prompt.",
                param=fields.prompt)
        return limit - num_prompt_tokens if requested is None else requested


def _check_allowed_tokens_left(params: SamplingParams, stops: set[int] | frozenset[int],
                               bad_words_token_ids: list[list[int]]) -> None:
    """Refuse ``allowed_token_ids`` that the request's own bans empty before its first token: every
    allowed id a one-token bad word, or, with ``min_tokens``, a stop token (EOS, ``stop_token_ids``)
    or a one-token bad word. Other contradictions (a grammar that allows none of them) show only
    while sampling and end the request there (``kvserve.sample.sampler.NoTokenAllowedError``).

    Raises:
        InvalidRequestError: ``param="allowed_token_ids"``.
    """
    if params.allowed_token_ids is None:
        return
    allowed = set(params.allowed_token_ids)
    banned = {sequence[0] for sequence in bad_words_token_ids if len(sequence) == 1}
    if allowed <= banned:
        raise InvalidRequestError("every id of allowed_token_ids is also banned by bad_words: no token could be "
                                  "generated", param="allowed_token_ids")
    if params.min_tokens > 0 and allowed <= banned | stops:
        stop_ids, others = sorted(allowed & stops), sorted(allowed - stops)
        bad_words = f" or banned by bad_words ({others})" if others else ""
        raise InvalidRequestError(
            f"every id of allowed_token_ids is a stop token (EOS or stop_token_ids: {stop_ids}){bad_words}, which "
            f"min_tokens={params.min_tokens} bans until that many tokens exist: no first token could be generated",
            param="allowed_token_ids")
