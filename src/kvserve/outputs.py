"""Results passed between engine layers and returned to users (vLLM-compatible names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch


class TokenLogprobs(NamedTuple):
    """Log-probabilities for one position.

    Attributes:
        token_id: the chosen (or, for prompt logprobs, the actual) token.
        logprob: its log-probability under the model's distribution after penalties/bias and
            temperature are NOT applied (the raw ``log_softmax`` of the logits, as vLLM returns).
        rank: 1-based rank of ``token_id`` among all tokens.
        top_token_ids: the ``k`` most likely token ids, most likely first.
        top_logprobs: their log-probabilities.
    """

    token_id: int
    logprob: float
    rank: int
    top_token_ids: list[int]
    top_logprobs: list[float]


class PromptLogprobsChunk(NamedTuple):
    """Logprobs of consecutive prompt tokens scored in one step: ``entries[j]`` scores the token
    at prompt position ``first_position + j`` (position 0 has no context and is never scored)."""

    first_position: int
    entries: list[TokenLogprobs]


@dataclass
class ModelRunnerOutput:
    """What one model step produced (``ModelRunner.execute_model``).

    Attributes:
        sampled_token_ids: request id -> the tokens sampled for it this step, for each request
            that sampled: one, or with draft tokens the accepted drafts and the target's own next
            token.
        logprobs: request id -> logprobs of its sampled tokens (requests asking for logprobs).
        prompt_logprobs: request id -> its prompt positions scored in this step.
        errors: request id -> why processing it failed in this step (the runner went on with the
            others; the scheduler finishes these with ``error``).
        refused: request id -> why the request cannot go on by its own fault (its constraints
            leave no token to sample): finished with ``error`` as the client's mistake (HTTP
            400), never counted toward the limits on failing requests that stop the engine.
        spec_token_ids: request id -> draft tokens proposed after sampling (speculative
            decoding), for the scheduler to schedule in the next step.
        pooler_output: request id -> the pooled vector (float32 CPU tensor [H]) of a pooling
            request whose prompt completed this step (``kvserve.pooling.pooler``).
    """

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    prompt_logprobs: dict[str, PromptLogprobsChunk] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    pooler_output: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class EngineCoreOutput:
    """Per request, what changed in one step: new tokens and, when finished, why.
    ``first_scheduled_time``: the request's ``Request.first_scheduled_time`` (seconds), for metrics.
    ``error``: why it failed; ``client_error``: the request's own fault (``ModelRunnerOutput.refused``).
    ``num_preemptions``: times the request was preempted (set when it finished), for metrics.
    ``pooling_output``: a pooling request's vector (float32 CPU tensor), on its finishing output."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    first_scheduled_time: float | None = None
    error: str | None = None
    client_error: bool = False
    num_preemptions: int = 0
    pooling_output: torch.Tensor | None = None
    num_external_tokens: int = 0  # of num_cached_tokens, loaded by the KV connector

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class CompletionOutput:
    """One choice of a request, as in vLLM. In a streamed (delta) output ``text``, ``token_ids``
    and ``logprobs`` hold only what is new since the previous output of the same choice."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    slo_missed: bool | None = None  # on a finished choice of a request with latency targets


@dataclass
class RequestOutput:
    """The result of one prompt, as in vLLM: ``outputs`` has one entry per choice (in a delta
    output, only the choices that changed). ``prompt_logprobs[0]`` is None (no context).
    ``error``: why a choice failed; ``client_error``: by the request's own fault (HTTP 400)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[TokenLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    error: str | None = None
    client_error: bool = False


@dataclass
class PoolingOutput:
    """vLLM's: what a pooling request produced. ``data``: float32 CPU tensor, [H] for ``embed``
    (the embedding, or its first ``dimensions`` values)."""

    data: torch.Tensor


@dataclass
class PoolingRequestOutput:
    """vLLM's: the result of one pooling request (a prompt in, ``outputs.data`` out; no text, no
    choices). ``outputs`` is None when the request failed (``error``; ``client_error``: by its own
    fault, HTTP 400). ``prompt``: its text, when given as text."""

    request_id: str
    outputs: PoolingOutput | None
    prompt_token_ids: list[int]
    num_cached_tokens: int
    finished: bool
    prompt: str | None = None
    error: str | None = None
    client_error: bool = False


@dataclass
class EmbeddingOutput:
    """vLLM's: one embedding as a list of floats (``hidden_size`` = its length)."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """vLLM's ``LLM.embed`` result: ``outputs.embedding``, ``prompt_token_ids``, ``request_id``."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    num_cached_tokens: int
    finished: bool
    error: Any = None

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> EmbeddingRequestOutput:
        """The embedding of a finished ``PoolingRequestOutput`` (an empty list when it failed)."""
        data = [] if output.outputs is None else output.outputs.data.tolist()
        return cls(output.request_id, EmbeddingOutput(data), output.prompt_token_ids, output.num_cached_tokens,
                   output.finished, output.error)


@dataclass
class ClassificationOutput:
    """vLLM's: one prompt's class probabilities (or logits, without the activation)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    """vLLM's ``LLM.classify`` result: ``outputs.probs``, ``prompt_token_ids``, ``request_id``."""

    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    num_cached_tokens: int
    finished: bool
    error: Any = None

    @classmethod
    def from_base(cls, output: PoolingRequestOutput) -> ClassificationRequestOutput:
        """The probabilities of a finished ``classify`` request (an empty list when it failed)."""
        probs = [] if output.outputs is None else output.outputs.data.tolist()
        return cls(output.request_id, ClassificationOutput(probs), output.prompt_token_ids, output.num_cached_tokens,
                   output.finished, output.error)


@dataclass
class ScoringOutput:
    """vLLM's: one pair's score (a cross-encoder's activated logit, or two embeddings' cosine)."""

    score: float


@dataclass
class ScoringRequestOutput:
    """vLLM's ``LLM.score`` result: ``outputs.score``, ``prompt_token_ids`` (a bi-encoder's pair:
    the query's, the pad id, the document's), ``request_id``."""

    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    num_cached_tokens: int
    finished: bool
    error: Any = None
