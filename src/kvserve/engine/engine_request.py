"""``EngineRequest``: one prompt of a call after the input processor, validated, normalised and
frozen: the spec every later shape references rather than copies (the scheduler's ``Request``,
``NewRequestData`` and the runner's ``CachedRequestState``, which the logits processors read).

A request with ``n > 1`` fans out into ``n`` scheduler ``Request`` objects (one per choice), as in
vLLM v1::

    EngineRequest "cmpl-7-0" (n=3) ─► Request "0_cmpl-7-0", "1_cmpl-7-0", "2_cmpl-7-0"
                                         seed s, s+1, s+2 (when seeded)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvserve.lora.request import LoRARequest
from kvserve.pooling.params import PoolingParams
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.slo.targets import SLOTarget
from kvserve.structured_output.grammar_request import GrammarRequest


def child_request_id(request_id: str, index: int, n: int) -> str:
    """The scheduler id of choice ``index``; the request's own id when ``n == 1``."""
    return request_id if n == 1 else f"{index}_{request_id}"


def child_sampling_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index`` of a seeded ``n > 1`` request draws from ``seed + index`` (as vLLM), so the
    choices differ while the request as a whole stays reproducible (the generator takes the seed
    modulo 2**64, see ``kvserve.model.input_batch.request_generator``)."""
    child = dataclasses.replace(params, n=1)
    if params.seed is not None and params.n > 1:
        child.seed = params.seed + index
    return child


@dataclass(frozen=True)
class EngineRequest:
    """A validated request for one prompt.

    Attributes:
        request_id: unique id (the API's ``<call id>-<prompt index>``).
        prompt: the prompt text, when the caller gave text (for ``RequestOutput.prompt``).
        prompt_token_ids: the prompt after truncation, every id in the vocabulary.
        sampling_params: validated; ``max_tokens`` resolved to an int (what the context allows).
        eos_token_ids: the EOS: ends generation with ``stop_reason`` None unless ``ignore_eos``
            (the model's other EOS ids are in ``sampling_params.stop_token_ids``; under
            ``ignore_eos`` all of them are here, only for ``min_tokens``' ban).
        bad_words_token_ids: ``bad_words`` as token-id sequences.
        priority: lower runs first under ``--scheduling-policy priority``.
        cache_salt: extra prefix-cache key (isolates tenants).
        arrival_time: ``time.time()`` when the caller received the request.
        grammar: the compiled structured-output constraint (each choice gets its own matcher
            in the runner), or None.
        lora_request: the adapter the request runs with, or None for the base model.
        pooling_params: a pooling request's resolved ``PoolingParams`` (its sampling parameters
            then say ``max_tokens`` 0: it computes its prompt and finishes with a vector,
            ``kvserve.pooling``), or None for a generation request.
        token_type_start: a cross-encoder pair's first token of segment type 1 (the document;
            ``kvserve.pooling.score_inputs``), or None: every token has type 0.
        slo: the request's latency targets (``kvserve.slo``), or None.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int]
    bad_words_token_ids: list[list[int]]
    priority: int
    cache_salt: str | None
    arrival_time: float
    grammar: GrammarRequest | None = None
    lora_request: LoRARequest | None = None
    pooling_params: PoolingParams | None = None
    token_type_start: int | None = None
    slo: SLOTarget | None = None

    @property
    def n(self) -> int:
        return self.sampling_params.n

    @property
    def max_tokens(self) -> int:
        return self.sampling_params.max_tokens

    @property
    def child_ids(self) -> list[str]:
        return [child_request_id(self.request_id, i, self.n) for i in range(self.n)]

    def choices(self) -> list[EngineRequest]:
        """The spec of each choice, in choice order: this request itself when ``n == 1``, else a
        copy with the choice's id and sampling parameters (``child_sampling_params``)."""
        if self.n == 1:
            return [self]
        return [dataclasses.replace(self, request_id=child_id,
                                    sampling_params=child_sampling_params(self.sampling_params, i))
                for i, child_id in enumerate(self.child_ids)]

    def make_requests(self) -> list[Request]:
        """One scheduler ``Request`` per choice, in choice order, each referencing its spec."""
        return [Request(spec) for spec in self.choices()]
