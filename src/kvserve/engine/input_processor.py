"""Turns a user request (prompt + SamplingParams) into the engine core's ``Request`` objects, one
per choice, validating what the core cannot know about."""

from __future__ import annotations

import time
from typing import Any

from kvserve.engine.output_processor import child_request_id, child_sampling_params
from kvserve.errors import InvalidRequestError
from kvserve.request import Request
from kvserve.sample.bad_words import tokenize_bad_words
from kvserve.sampling_params import SamplingParams


class InputProcessor:
    """Args:
    tokenizer: the model's tokenizer (string prompts are encoded with its special tokens, e.g. BOS).
    vocab_size: model vocabulary size (token ids must be below it).
    max_model_len: context length in tokens.
    eos_token_ids: ids that end generation unless ``ignore_eos``.
    max_n: largest ``n`` accepted.
    priority_scheduling: whether the scheduler orders by ``priority`` (else a non-zero priority
        is refused, as vLLM does, rather than silently ignored).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, max_model_len: int, eos_token_ids: frozenset[int],
                 max_n: int = 128, priority_scheduling: bool = False):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.max_n = max_n
        self.priority_scheduling = priority_scheduling

    def tokenize(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt))

    def validate_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raises:
        InvalidRequestError: empty prompt or a token id outside the vocabulary.
        """
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty; at least 1 token is required", param="prompt")
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt token id {bad[0]!r} is outside the vocabulary (0..{self.vocab_size - 1})", param="prompt"
            )

    def resolve_max_tokens(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        """``max_tokens`` or, when None, what is left of the context (a ``max_tokens`` that does
        not fit is refused by the scheduler's admission check).

        Raises:
            InvalidRequestError: no ``max_tokens`` and the prompt fills the context.
        """
        if params.max_tokens is not None:
            return params.max_tokens
        left = self.max_model_len - num_prompt_tokens
        if left < 1:
            raise InvalidRequestError(
                f"prompt has {num_prompt_tokens} tokens; this model accepts at most {self.max_model_len} "
                f"tokens, so no room is left to generate", param="prompt",
            )
        return left

    def make_requests(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> list[Request]:
        """One ``Request`` per choice (ids from ``child_request_id``). The prompt is cut to its
        last ``truncate_prompt_tokens`` tokens first; ``bad_words`` are tokenized once.

        Raises:
            InvalidRequestError: see ``validate_prompt``, ``resolve_max_tokens``; ``n`` above
                ``max_n``; ``truncate_prompt_tokens`` above the context length; a non-zero
                ``priority`` without priority scheduling; token ids in ``logit_bias`` / ``stop_token_ids`` /
                ``allowed_token_ids`` outside the vocabulary; a bad word that encodes to nothing.
        """
        if params.truncate_prompt_tokens is not None and params.truncate_prompt_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"truncate_prompt_tokens ({params.truncate_prompt_tokens}) is greater than the context length "
                f"({self.max_model_len} tokens); choose a smaller truncation", param="truncate_prompt_tokens")
        if priority != 0 and not self.priority_scheduling:
            raise InvalidRequestError(
                f"priority {priority} needs priority scheduling, which this server does not use "
                "(start it with --scheduling-policy priority); omit priority or send 0", param="priority")
        prompt_token_ids = params.truncated_prompt(prompt_token_ids)
        self.validate_prompt(prompt_token_ids)
        if params.n > self.max_n:
            raise InvalidRequestError(f"n must be at most {self.max_n}, got {params.n}", param="n")
        params.validate_for_vocab(self.vocab_size)
        max_tokens = self.resolve_max_tokens(len(prompt_token_ids), params)
        bad_words_token_ids = tokenize_bad_words(self.tokenizer, params.bad_words, self.vocab_size)
        arrival = time.time() if arrival_time is None else arrival_time
        return [
            Request(
                request_id=child_request_id(request_id, i, params.n),
                prompt_token_ids=list(prompt_token_ids),
                sampling_params=child_sampling_params(params, i),
                eos_token_ids=self.eos_token_ids,
                max_tokens=max_tokens,
                arrival_time=arrival,
                priority=priority,
                cache_salt=cache_salt,
                bad_words_token_ids=bad_words_token_ids,
            )
            for i in range(params.n)
        ]
