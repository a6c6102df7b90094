"""Per-batch sampling tensors, built once per engine step from the requests that sample.

Row ``i`` of every tensor belongs to ``requests[i]``, the request whose logits are row ``i`` of
the ``[N, V]`` logits handed to :class:`kvserve.sample.sampler.Sampler`. Flags such as
``all_greedy`` and ``no_penalties`` let the sampler skip whole stages, so a greedy batch without
logprobs costs one ``argmax``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.errors import InvalidRequestError
from kvserve.request import Request
from kvserve.sample.allowed_tokens import AllowedTokenMask, build_allowed_token_mask
from kvserve.sample.bad_words import bad_words_pairs


@dataclass(frozen=True)
class SparseLogitUpdate:
    """Sparse ``(row, token, value)`` triples applied to the ``[N, V]`` logits.

    Attributes:
        rows: int64 ``[B]``, batch row of each entry.
        token_ids: int64 ``[B]``, token id (column) of each entry.
        values: float32 ``[B]``; a bias to add (logit_bias) or unused (masks).
    """

    rows: torch.Tensor
    token_ids: torch.Tensor
    values: torch.Tensor


@dataclass(frozen=True)
class SamplingMetadata:
    """Everything the sampler needs for one batch of ``N`` rows over a vocabulary of ``V``.

    Attributes:
        temperature: float32 ``[N]``; greedy rows hold 1.0 (they are argmax'ed, never divided).
        greedy_mask: bool ``[N]``, True where the row is greedy (temperature < 1e-5).
        all_greedy / all_random: every row greedy / no row greedy.
        top_k: int64 ``[N]`` with ``V`` meaning "off", or ``None`` when no row uses top-k.
        top_p: float32 ``[N]`` (1.0 = off), or ``None`` when no row uses top-p.
        min_p: float32 ``[N]`` (0.0 = off), or ``None`` when no row uses min-p.
        generators: per row, the request's own ``torch.Generator`` (seeded request) or None.
        logit_bias: ``SparseLogitUpdate`` of biases to add, or ``None``.
        min_tokens_mask: ``SparseLogitUpdate`` of (row, token) pairs to set to ``-inf`` because
            the request has fewer than ``min_tokens`` output tokens, or ``None``.
        no_penalties: no row has a presence, frequency or repetition penalty.
        penalty_rows: int64 ``[P]``, the rows that have a penalty (the next four tensors hold
            only these rows, so unpenalized rows cost no ``[V]`` statistics).
        presence_penalties, frequency_penalties, repetition_penalties: float32 ``[P]``.
        prompt_token_mask: bool ``[P, V]``, token occurs in the row's prompt (None if
            ``no_penalties``).
        output_token_counts: int32 ``[P, V]``, occurrences in the row's output (None if
            ``no_penalties``).
        num_logprobs: per row, how many top alternatives to return, or None (no logprobs).
        max_num_logprobs: the largest ``num_logprobs`` entry, or None when no row asks.
        allowed_token_mask: the rows with ``allowed_token_ids`` and what each allows, or None.
        bad_words_mask: ``SparseLogitUpdate`` of (row, token) pairs to set to ``-inf`` because
            they would complete a bad word (see ``kvserve.sample.bad_words``), or None.
    """

    temperature: torch.Tensor
    greedy_mask: torch.Tensor
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    generators: list[torch.Generator | None]
    logit_bias: SparseLogitUpdate | None
    min_tokens_mask: SparseLogitUpdate | None
    no_penalties: bool
    penalty_rows: torch.Tensor
    presence_penalties: torch.Tensor
    frequency_penalties: torch.Tensor
    repetition_penalties: torch.Tensor
    prompt_token_mask: torch.Tensor | None
    output_token_counts: torch.Tensor | None
    num_logprobs: list[int | None]
    max_num_logprobs: int | None
    allowed_token_mask: AllowedTokenMask | None = None
    bad_words_mask: SparseLogitUpdate | None = None

    @property
    def num_rows(self) -> int:
        return len(self.num_logprobs)

    @classmethod
    def build(
        cls,
        requests: list[Request],
        generators: list[torch.Generator | None],
        vocab_size: int,
        device: torch.device | str,
    ) -> SamplingMetadata:
        """Gather the sampling parameters of ``requests`` into per-row tensors on ``device``.

        Args:
            requests: one per logits row, in row order.
            generators: per row, the request's own generator (requests with a ``seed``) or None;
                a generator must live on ``device``.
            vocab_size: ``V``, the number of logits columns.
            device: where the tensors go (the logits' device).

        Raises:
            InvalidRequestError: a ``logit_bias`` token id is outside ``[0, vocab_size)``.
            ValueError: ``generators`` and ``requests`` differ in length.
        """
        if len(generators) != len(requests):
            raise ValueError(f"got {len(generators)} generators for {len(requests)} requests")
        params = [r.sampling_params for r in requests]

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        greedy = [p.is_greedy for p in params]
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        any_top_k = any(k < vocab_size for k in top_k)
        penalized = [
            i for i, p in enumerate(params)
            if p.presence_penalty != 0 or p.frequency_penalty != 0 or p.repetition_penalty != 1
        ]
        prompt_mask, output_counts = (None, None)
        if penalized:
            prompt_mask, output_counts = _token_statistics([requests[i] for i in penalized], vocab_size, device)
        num_logprobs = [p.logprobs for p in params]
        wanted = [k for k in num_logprobs if k is not None]
        return cls(
            temperature=floats([1.0 if g else p.temperature for g, p in zip(greedy, params)]),
            greedy_mask=torch.tensor(greedy, dtype=torch.bool, device=device),
            all_greedy=all(greedy),
            all_random=not any(greedy),
            top_k=torch.tensor(top_k, dtype=torch.int64, device=device) if any_top_k else None,
            top_p=floats([p.top_p for p in params]) if any(p.top_p < 1 for p in params) else None,
            min_p=floats([p.min_p for p in params]) if any(p.min_p > 0 for p in params) else None,
            generators=list(generators),
            logit_bias=_logit_bias(requests, vocab_size, device),
            min_tokens_mask=_min_tokens_mask(requests, vocab_size, device),
            no_penalties=not penalized,
            penalty_rows=torch.tensor(penalized, dtype=torch.int64, device=device),
            presence_penalties=floats([params[i].presence_penalty for i in penalized]),
            frequency_penalties=floats([params[i].frequency_penalty for i in penalized]),
            repetition_penalties=floats([params[i].repetition_penalty for i in penalized]),
            prompt_token_mask=prompt_mask,
            output_token_counts=output_counts,
            num_logprobs=num_logprobs,
            max_num_logprobs=max(wanted) if wanted else None,
            allowed_token_mask=build_allowed_token_mask(requests, vocab_size, device),
            bad_words_mask=_sparse([(row, t, 0.0) for row, t in bad_words_pairs(requests)], device),
        )


def _sparse(triples: list[tuple[int, int, float]], device: torch.device | str) -> SparseLogitUpdate | None:
    if not triples:
        return None
    rows, token_ids, values = zip(*triples)
    return SparseLogitUpdate(
        rows=torch.tensor(rows, dtype=torch.int64, device=device),
        token_ids=torch.tensor(token_ids, dtype=torch.int64, device=device),
        values=torch.tensor(values, dtype=torch.float32, device=device),
    )


def _logit_bias(
    requests: list[Request], vocab_size: int, device: torch.device | str
) -> SparseLogitUpdate | None:
    triples = []
    for row, request in enumerate(requests):
        for token_id, bias in (request.sampling_params.logit_bias or {}).items():
            if not 0 <= token_id < vocab_size:
                raise InvalidRequestError(
                    f"logit_bias key {token_id} is out of the vocabulary (token ids are 0..{vocab_size - 1})",
                    param="logit_bias",
                )
            triples.append((row, token_id, float(bias)))
    return _sparse(triples, device)


def _min_tokens_mask(
    requests: list[Request], vocab_size: int, device: torch.device | str
) -> SparseLogitUpdate | None:
    """(row, token) pairs to forbid: stop tokens, and EOS unless ``ignore_eos``, while the request
    has fewer than ``min_tokens`` output tokens. Ids outside the vocabulary cannot be sampled anyway
    and are skipped."""
    triples = []
    for row, request in enumerate(requests):
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            continue
        banned = set(params.stop_token_ids)
        if not params.ignore_eos:
            banned |= set(request.eos_token_ids)
        triples.extend((row, t, 0.0) for t in sorted(banned) if 0 <= t < vocab_size)
    return _sparse(triples, device)


def _token_statistics(
    requests: list[Request], vocab_size: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt-occurrence mask (bool ``[N, V]``) and output-token counts (int32 ``[N, V]``), by a
    scatter over padded id tensors (the pad id ``V`` lands in a spare column that is dropped)."""

    def padded(lists: list[list[int]]) -> torch.Tensor:
        width = max((len(ids) for ids in lists), default=0)
        rows = [ids + [vocab_size] * (width - len(ids)) for ids in lists]
        return torch.tensor(rows, dtype=torch.int64, device=device).reshape(len(lists), width)

    num_rows = len(requests)
    prompt_ids = padded([list(r.prompt_token_ids) for r in requests])
    output_ids = padded([list(r.output_token_ids) for r in requests])
    prompt_mask = torch.zeros(num_rows, vocab_size + 1, dtype=torch.bool, device=device)
    prompt_mask.scatter_(1, prompt_ids, True)
    counts = torch.zeros(num_rows, vocab_size + 1, dtype=torch.int32, device=device)
    counts.scatter_add_(1, output_ids, torch.ones_like(output_ids, dtype=torch.int32))
    return prompt_mask[:, :vocab_size], counts[:, :vocab_size]
