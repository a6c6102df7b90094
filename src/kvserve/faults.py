"""Fault injection: the seam the failure-isolation tests use to make one request's processing
fail at a chosen stage. The engine calls ``check`` at each stage; with no rule set it is a
dictionary lookup.

Stages: ``prepare`` (the runner takes the request into its batch / builds its inputs),
``forward`` (the model runs the batch holding it), ``sample`` (its logits are processed and
sampled, or its draft tokens verified), ``propose`` (speculative decoding proposes its next draft
tokens), ``detokenize`` (the front end turns its tokens into text), ``pool`` (a pooling
request's hidden states are pooled into its vector).
"""

from __future__ import annotations

from collections.abc import Iterable

STAGES = ("prepare", "forward", "sample", "detokenize")  # every request passes these
SPECULATIVE_STAGES = ("propose",)  # only requests that speculate
POOLING_STAGES = ("pool",)  # only pooling requests


class InjectedFault(RuntimeError):
    """The error an injected fault raises."""


class FaultInjector:
    """Which requests fail at which stage: ``fail(stage, name)`` fails every request whose id
    contains ``name`` (the API's ids carry the client's ``X-Request-Id``); ``"*"`` fails every
    request there (a failure no single request explains)."""

    def __init__(self) -> None:
        self._rules: dict[str, set[str]] = {}

    def fail(self, stage: str, request_id: str) -> None:
        stages = STAGES + SPECULATIVE_STAGES + POOLING_STAGES
        if stage not in stages:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(stages)}")
        self._rules.setdefault(stage, set()).add(request_id)

    def clear(self) -> None:
        self._rules.clear()

    def check(self, stage: str, request_ids: Iterable[str]) -> None:
        """Raises InjectedFault when a rule names ``stage`` and one of ``request_ids`` (or ``*``)."""
        if not self._rules:
            return
        failing = self._rules.get(stage)
        if not failing:
            return
        for request_id in request_ids:
            if "*" in failing or any(name in request_id for name in failing):
                raise InjectedFault(f"injected fault at {stage} for request {request_id}")
