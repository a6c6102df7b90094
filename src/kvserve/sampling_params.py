"""Per-request sampling parameters, named and defaulted as in vLLM's ``SamplingParams`` and the
OpenAI API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.structured_output.params import StructuredOutputsParams

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
        logit_bias: token id -> bias added to its logit (clamped to [-100, 100] by the input
            processor, as vLLM).
        seed: seed of this request's own generator (same tokens whatever else is in the batch).
        max_tokens: most tokens to generate; ``None`` = until the context is full.
        min_tokens: EOS and ``stop_token_ids`` are suppressed, and stop strings not checked,
            until this many tokens exist.
        stop: strings that end generation when they appear in the text (not included in it unless
            ``include_stop_str_in_output``).
        stop_token_ids: token ids that end generation (included in the token ids; their text,
            like EOS's, is left out unless ``include_stop_str_in_output``).
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
            >= 1, or -1 for the last ``max_model_len``; None keeps the whole prompt (vLLM).
        structured_outputs: a constraint the output must follow (a JSON Schema, a regex, a
            choice, a grammar; ``kvserve.structured_output.StructuredOutputsParams``, vLLM's).

    ``max_tokens=0`` generates nothing: the request computes its prompt only when it asks for
    ``prompt_logprobs`` and finishes with ``length`` without sampling a token (the OpenAI API
    allows it only with ``echo`` on ``/v1/completions``, for scoring prompts).

    Construction only normalises shapes (a single ``stop`` string becomes a list, ``top_k=-1``
    becomes 0); the ranges above are checked by the engine's input processor
    (``kvserve.engine.param_validation``), the one place that validates a request, so an offline
    call and an HTTP request get the same error.
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
    structured_outputs: StructuredOutputsParams | None = None

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

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    def truncated_prompt(self, prompt_token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt after ``truncate_prompt_tokens``: its last that many tokens (-1: the last
        ``max_model_len``); the whole prompt when None or when it is shorter."""
        limit = max_model_len if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens
        return truncate_prompt(prompt_token_ids, limit)


def truncate_prompt(prompt_token_ids: list[int], limit: int | None) -> list[int]:
    """The last ``limit`` tokens of the prompt (left truncation, as vLLM's
    ``truncate_prompt_tokens``); the whole prompt when ``limit`` is None or not smaller."""
    if limit is None or len(prompt_token_ids) <= limit:
        return list(prompt_token_ids)
    return list(prompt_token_ids[-limit:])
