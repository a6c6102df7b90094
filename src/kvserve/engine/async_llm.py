"""The asynchronous engine front that the HTTP layer talks to (contract; implemented by the lead).

The engine core runs in its own thread; ``AsyncLLM`` hands it requests and turns its per-step
outputs into per-request async streams of *delta* ``RequestOutput`` objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams


class EngineClient(ABC):
    """What the API layer may use. Attributes set by implementations:

    - ``model_name: str`` (served model name), ``max_model_len: int`` (tokens),
      ``vocab_size: int``, ``tokenizer`` (a Hugging Face tokenizer), ``eos_token_ids: set[int]``.
    """

    model_name: str
    max_model_len: int
    vocab_size: int
    tokenizer: Any

    @abstractmethod
    def generate(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream delta outputs of one request (all ``sampling_params.n`` choices).

        Each yielded ``RequestOutput`` carries only the choices that changed since the last one;
        a choice's ``CompletionOutput`` has the new text (detokenized incrementally, never a
        broken UTF-8 character, stop strings already cut), new token ids, new ``TokenLogprobs``
        (if asked), and ``finish_reason`` on its last delta. The first yielded output carries
        ``prompt_logprobs`` (if asked) and ``num_cached_tokens`` (prefix-cache hits, tokens). The
        iterator ends after every choice finished. Cancelling the consumer (client disconnect)
        aborts the request within one engine step.

        Raises (before the first yield):
            InvalidRequestError: prompt + max_tokens exceed ``max_model_len`` (message gives the
                numbers), or token ids outside the vocabulary.
            RequestRejectedError: the waiting queue is full (reason ``queue_full``) or the engine
                is shutting down (reason ``shutting_down``).
        """

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Abort a request; its KV blocks are freed within one engine step."""

    @property
    @abstractmethod
    def is_ready(self) -> bool:
        """True once the model is loaded and the engine loop runs; False if it died."""
