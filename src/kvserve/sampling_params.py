"""Per-request sampling parameters, named and defaulted as in vLLM's ``SamplingParams`` and the
OpenAI API."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvserve.errors import InvalidRequestError

# Temperatures below this are treated as greedy (argmax), as vLLM does.
GREEDY_TEMPERATURE_EPS = 1e-5


@dataclass
class SamplingParams:
    """How to choose tokens for one request.

    Attributes:
        n: number of independent samples (choices) for the prompt.
        temperature: softmax temperature; 0 = greedy.
        top_p: nucleus mass in (0, 1] (Holtzman et al. 2019, "The Curious Case of Neural Text
            Degeneration").
        top_k: keep the k most likely tokens; 0 or -1 = all.
        min_p: drop tokens whose probability is below ``min_p`` times the top one's, in [0, 1].
        presence_penalty, frequency_penalty: OpenAI's penalties in [-2, 2], applied to logits of
            tokens generated so far: ``logit -= presence * (count > 0) + frequency * count``.
        repetition_penalty: CTRL's penalty (Keskar et al. 2019) > 0 over prompt and output tokens:
            positive logits are divided by it, negative ones multiplied.
        logit_bias: token id -> bias added to its logit, each in [-100, 100].
        seed: seed of this request's own generator (same tokens whatever else is in the batch).
        max_tokens: most tokens to generate; ``None`` = until the context is full.
        min_tokens: EOS and ``stop_token_ids`` are suppressed until this many tokens exist.
        stop: strings that end generation when they appear in the text (not included in it unless
            ``include_stop_str_in_output``).
        stop_token_ids: token ids that end generation (included in the token ids, not the text).
        ignore_eos: keep generating past EOS.
        logprobs: number of top alternatives to return per generated token (0 = only the chosen).
        prompt_logprobs: the same for prompt tokens.
        skip_special_tokens: drop special tokens from the detokenized text.
        allowed_token_ids: when set, only these token ids can be generated (every other logit is
            -inf before sampling or argmax); a non-empty list of ids in the vocabulary (vLLM).
        bad_words: words never generated (vLLM): each is tokenized with and without a leading
            space, and the last token of such a sequence is banned whenever the generated tokens
            end with the rest of it (a one-token word is always banned); see
            ``kvserve.sample.bad_words``.
        truncate_prompt_tokens: keep only the last this many prompt tokens (left truncation),
            >= 1; None keeps the whole prompt (vLLM).

    ``max_tokens=0`` generates nothing: the request computes its prompt only when it asks for
    ``prompt_logprobs`` and finishes with ``length`` without sampling a token (the OpenAI API
    allows it only with ``echo`` on ``/v1/completions``, for scoring prompts).

    Raises:
        InvalidRequestError: on any value outside the ranges above (``param`` names the field).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = field(default_factory=list)
    truncate_prompt_tokens: int | None = None

    MAX_LOGPROBS = 20

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.bad_words, str):
            self.bad_words = [self.bad_words]
        self.bad_words = list(self.bad_words or [])
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    def _validate(self) -> None:
        def bad(param: str, message: str) -> None:
            raise InvalidRequestError(message, param=param)

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", f"n must be an integer >= 1, got {self.n!r}")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                bad(name, f"{name} must be a finite number, got {value!r}")
        if self.temperature < 0:
            bad("temperature", f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            bad("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            bad("top_k", f"top_k must be -1 (disable) or >= 1, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            bad("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                bad(name, f"{name} must be in [-2, 2], got {value}")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 0):
            bad("max_tokens", f"max_tokens must be >= 0 (0 = score the prompt only), got {self.max_tokens!r}")
        if self.min_tokens < 0:
            bad("min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= self.MAX_LOGPROBS:
                bad(name, f"{name} must be in [0, {self.MAX_LOGPROBS}], got {value}")
        if self.logit_bias:
            for token_id, bias in self.logit_bias.items():
                if not isinstance(token_id, int) or token_id < 0:
                    bad("logit_bias", f"logit_bias keys must be token ids (integers >= 0), got {token_id!r}")
                if not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
                    bad("logit_bias", f"logit_bias values must be in [-100, 100], got {bias} for token {token_id}")
        if any(not s for s in self.stop):
            bad("stop", "stop strings must be non-empty")
        self._validate_token_restrictions(bad)

    def _validate_token_restrictions(self, bad) -> None:
        """allowed_token_ids, bad_words and truncate_prompt_tokens (vLLM's extensions)."""
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                bad("allowed_token_ids", "allowed_token_ids must not be empty (omit it to allow every token)")
            wrong = [t for t in self.allowed_token_ids if not isinstance(t, int) or isinstance(t, bool) or t < 0]
            if wrong:
                bad("allowed_token_ids", f"allowed_token_ids must be token ids (integers >= 0), got {wrong[0]!r}")
        for word in self.bad_words:
            if not isinstance(word, str) or not word.strip():
                bad("bad_words", f"bad_words entries must be non-empty words, got {word!r}")
        check_truncate_prompt_tokens(self.truncate_prompt_tokens)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    def truncated_prompt(self, prompt_token_ids: list[int]) -> list[int]:
        """The prompt after ``truncate_prompt_tokens``: its last that many tokens (all of them
        when None or when the prompt is shorter)."""
        return truncate_prompt(prompt_token_ids, self.truncate_prompt_tokens)

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Check token ids against the model's vocabulary.

        Raises:
            InvalidRequestError: a ``logit_bias`` key, ``stop_token_ids`` or ``allowed_token_ids``
                entry >= vocab_size.
        """
        for token_id in self.allowed_token_ids or ():
            if token_id >= vocab_size:
                raise InvalidRequestError(
                    f"allowed_token_ids entry {token_id} is out of the vocabulary (token ids are 0..{vocab_size - 1})",
                    param="allowed_token_ids",
                )
        for token_id in (self.logit_bias or {}):
            if token_id >= vocab_size:
                raise InvalidRequestError(
                    f"logit_bias key {token_id} is out of the vocabulary (token ids are 0..{vocab_size - 1})",
                    param="logit_bias",
                )
        for token_id in self.stop_token_ids:
            if not 0 <= token_id < vocab_size:
                raise InvalidRequestError(
                    f"stop_token_ids entry {token_id} is out of the vocabulary (0..{vocab_size - 1})",
                    param="stop_token_ids",
                )


def check_truncate_prompt_tokens(limit: int | None) -> None:
    """Raises:
    InvalidRequestError: ``limit`` is not None and not an integer >= 1.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise InvalidRequestError(
            f"truncate_prompt_tokens must be an integer >= 1 (the number of prompt tokens to keep, "
            f"counted from the end), got {limit!r}", param="truncate_prompt_tokens")


def truncate_prompt(prompt_token_ids: list[int], limit: int | None) -> list[int]:
    """The last ``limit`` tokens of the prompt (left truncation, as vLLM's
    ``truncate_prompt_tokens``); the whole prompt when ``limit`` is None or not smaller."""
    if limit is None or len(prompt_token_ids) <= limit:
        return list(prompt_token_ids)
    return list(prompt_token_ids[-limit:])
