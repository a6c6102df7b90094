"""Beam search, as vLLM 0.32 runs it (``vllm/entrypoints/generate/beam_search``): the search of
one prompt, step by step, with no engine in it. The drivers (``LLM.beam_search`` offline,
``kvserve.engine.beam_search_stream`` online) run each step as one engine request per live beam
(``max_tokens=1``, the ``2 * beam_width`` most likely next tokens as logprobs; the prefix cache
makes each beam's prompt nearly free) and feed the answers to :meth:`BeamSearch.advance`::

    beams ─► engine: top 2k next tokens of each ─► candidates (beam + token, cum logprob)
      ▲            EOS candidates are completed (unless ignore_eos)  │
      └──────── the k best other candidates by cumulative logprob ◄──┘
    after max_tokens steps (or no live beam): the k best of completed + live by score

Score (vLLM's ``get_beam_search_score``, from transformers): ``cum_logprob / len ** length_penalty``
where ``len`` counts the prompt and the generated tokens, a final EOS not counted. There is no
early stop: the search runs ``max_tokens`` steps unless every beam ended. Logprobs are the model's
raw ``log_softmax`` (temperature, penalties and stop strings play no part, as in vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.engine.param_validation import MAX_LOGPROBS
from kvserve.errors import InvalidRequestError, RequestFailedError
from kvserve.outputs import RequestOutput, TokenLogprobs
from kvserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``.

    Attributes:
        beam_width: beams kept at each step and sequences returned (the API's ``n``).
        max_tokens: steps (tokens generated per beam at most); None: as many as the context
            leaves after the prompt.
        ignore_eos: EOS is a token like any other (no beam completes).
        temperature: accepted as vLLM does; it does not change the raw logprobs beams are ranked by.
        length_penalty: the exponent of the length in the final score.
        include_stop_str_in_output: a completed beam's tokens end with its EOS.
        skip_special_tokens: when the sequences are decoded to text.
    """

    beam_width: int
    max_tokens: int | None
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")

    @property
    def num_candidates(self) -> int:
        """Next tokens looked at per beam and step (vLLM's and transformers' ``2 * beam_width``)."""
        return 2 * self.beam_width

    def check(self) -> None:
        """Raises InvalidRequestError: a beam wider than the logprobs a step can return."""
        if self.num_candidates > MAX_LOGPROBS:
            raise InvalidRequestError(
                f"beam search looks at 2 * n next tokens of each beam per step, at most {MAX_LOGPROBS} logprobs: "
                f"n must be at most {MAX_LOGPROBS // 2} with use_beam_search, got {self.beam_width}", param="n")

    def step_params(self, logprobs: int | None = None) -> SamplingParams:
        """The engine request of one beam's step: one greedy token and the ``num_candidates``
        (or ``logprobs``, if more) most likely next tokens with their raw logprobs."""
        return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                              logprobs=max(self.num_candidates, logprobs or 0))

    def whole_params(self) -> SamplingParams:
        """What a prompt is validated with before the search: the whole search must fit the
        context (prompt + ``max_tokens``) as one request of ``max_tokens`` would; the validated
        request's ``sampling_params.max_tokens`` is the search's number of steps."""
        return SamplingParams(max_tokens=self.max_tokens, temperature=0.0, logprobs=self.num_candidates)


@dataclass
class BeamSearchSequence:
    """One beam (vLLM's ``BeamSearchSequence``).

    Attributes:
        tokens: the prompt's token ids, then the generated ones.
        cum_logprob: sum of the generated tokens' logprobs (a completed beam's EOS included).
        logprobs: per generated token, the step's most likely tokens ``{token id: logprob}``, best
            first (the candidates, or more when the caller asked for more logprobs).
        finish_reason: ``stop`` (EOS), ``length`` or ``abort``; None while live.
        stop_reason: the EOS id of a beam that stopped.
        text: the decoded sequence, filled in by the driver.
    """

    tokens: list[int]
    cum_logprob: float = 0.0
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | None = None
    text: str | None = None


def step_candidates(output: RequestOutput) -> list[tuple[int, float]]:
    """A finished one-token step's most likely next tokens ``(token id, logprob)``, best first.

    Raises:
        RequestFailedError: the step's request failed in the engine.
    """
    if output.error is not None:
        raise RequestFailedError(output.error, output.request_id)
    (choice,) = output.outputs
    top = choice.logprobs[0]
    return list(zip(top.top_token_ids, top.top_logprobs))


def beam_score(tokens: list[int], cum_logprob: float, eos_token_id: int | None, length_penalty: float) -> float:
    """``cum_logprob / len(tokens) ** length_penalty``, a final EOS not counted in the length."""
    length = len(tokens) - (1 if tokens and tokens[-1] == eos_token_id else 0)
    return cum_logprob / (max(length, 1) ** length_penalty)


class BeamSearch:
    """The search of one prompt.

    Args:
        prompt_token_ids: the prompt.
        params: the search's parameters.
        eos_token_id: the tokenizer's EOS id (vLLM's rule: only this one ends a beam).
        max_tokens: the steps, when ``params.max_tokens`` is None (resolved against the context).
    """

    def __init__(self, prompt_token_ids: list[int], params: BeamSearchParams, eos_token_id: int | None,
                 max_tokens: int | None = None):
        self.prompt_len = len(prompt_token_ids)
        self.params = params
        self.max_tokens = params.max_tokens if max_tokens is None else max_tokens
        if self.max_tokens is None:
            raise ValueError("max_tokens must be resolved against the context before the search")
        self.eos_token_id = eos_token_id
        self.beams = [BeamSearchSequence(list(prompt_token_ids))]
        self.completed: list[BeamSearchSequence] = []
        self.steps = 0

    @property
    def done(self) -> bool:
        return not self.beams or self.steps >= self.max_tokens

    def advance(self, candidates: list[list[tuple[int, float]]]) -> None:
        """One step: ``candidates[i]`` holds beam ``i``'s most likely next tokens ``(token id,
        logprob)``, most likely first (at least ``params.num_candidates`` of them, or all; the
        first ``num_candidates`` compete)."""
        if len(candidates) != len(self.beams):
            raise ValueError(f"got candidates for {len(candidates)} beams, {len(self.beams)} are live")
        expanded: list[tuple[float, int, BeamSearchSequence, dict[int, float]]] = []
        for beam, top in zip(self.beams, candidates):
            step_logprobs = dict(top)
            for token_id, logprob in top[:self.params.num_candidates]:
                cum_logprob = beam.cum_logprob + logprob
                if token_id == self.eos_token_id and not self.params.ignore_eos:
                    tokens = beam.tokens + [token_id] if self.params.include_stop_str_in_output else beam.tokens
                    self.completed.append(BeamSearchSequence(tokens, cum_logprob, beam.logprobs + [step_logprobs],
                                                             "stop", token_id))
                else:
                    expanded.append((cum_logprob, token_id, beam, step_logprobs))
        expanded.sort(key=lambda c: -c[0])  # stable: ties keep beam order, then rank order
        self.beams = [BeamSearchSequence(beam.tokens + [token_id], cum_logprob, beam.logprobs + [step_logprobs])
                      for cum_logprob, token_id, beam, step_logprobs in expanded[:self.params.beam_width]]
        self.steps += 1

    def abort(self) -> None:
        """End the search now: the live beams count as aborted."""
        for beam in self.beams:
            beam.finish_reason = "abort"
        self.completed.extend(self.beams)
        self.beams = []

    def best(self) -> list[BeamSearchSequence]:
        """The ``beam_width`` best of the completed and live beams, best first (live ones
        finish with ``length``)."""
        for beam in self.beams:
            beam.finish_reason = beam.finish_reason or "length"
        pool = self.completed + self.beams
        pool.sort(key=lambda b: -beam_score(b.tokens, b.cum_logprob, self.eos_token_id, self.params.length_penalty))
        return pool[:self.params.beam_width]

    def generated(self, beam: BeamSearchSequence) -> list[int]:
        """The beam's generated token ids."""
        return beam.tokens[self.prompt_len:]

    def token_logprobs(self, beam: BeamSearchSequence, top: int) -> list[TokenLogprobs]:
        """Its generated tokens' logprobs as the engine reports a sampled token's: the token's
        logprob and rank among the step's most likely tokens (which hold it) and the ``top`` best."""
        result = []
        for token_id, step in zip(self.generated(beam), beam.logprobs):
            ranked = list(step)
            result.append(TokenLogprobs(token_id, step[token_id], ranked.index(token_id) + 1, ranked[:top],
                                        [step[t] for t in ranked[:top]]))
        return result

    def text_ids(self, beam: BeamSearchSequence) -> list[int]:
        """The generated ids its text shows: without a final EOS (vLLM's online rule)."""
        ids = self.generated(beam)
        if ids and ids[-1] == self.eos_token_id and not self.params.ignore_eos:
            return ids[:-1]
        return ids
