"""The proposer interface: draft tokens for the next step, after sampling (vLLM's v1 runner
proposes there too and hands the drafts to the scheduler in the step's output).

    execute_model:  ... sample/verify ... -> propose_drafts(proposer, batch, req_ids, ...)
                    -> ModelRunnerOutput.spec_token_ids -> Scheduler.update_from_output keeps them
                    on the requests -> the next schedule() gives each 1 + len(drafts) tokens

Implementations are registered by method name (``@register_proposer``): ``ngram``
(``ngram_proposer``) and ``draft_model`` (``draft_model``). A test may install its own (the
runner's ``proposer`` attribute) to force drafts.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from kvserve.faults import FaultInjector
from kvserve.outputs import ModelRunnerOutput

logger = logging.getLogger(__name__)


class Proposer(ABC):
    """Proposes draft tokens for requests of the persistent batch.

    Errors: ``propose`` may raise for a group of requests; :func:`propose_drafts` then runs each
    half again and finishes only a request that fails alone (as the runner does for the forward).
    """

    name: ClassVar[str]

    @abstractmethod
    def propose(self, batch: Any, rows: list[int]) -> list[list[int]]:
        """Drafts for the requests in ``rows`` of ``batch`` (an ``InputBatch``): request ``i``'s
        known tokens are ``batch.token_ids[rows[i], :batch.num_tokens[rows[i]]]``.

        Returns:
            per row, at most ``num_speculative_tokens`` token ids (empty: no proposal).
        """


PROPOSERS: dict[str, type[Proposer]] = {}


def register_proposer(cls: type[Proposer]) -> type[Proposer]:
    """Class decorator adding a proposer to :data:`PROPOSERS` under ``cls.name``."""
    PROPOSERS[cls.name] = cls
    return cls


def propose_drafts(proposer: Proposer, batch: Any, req_ids: frozenset[str], faults: FaultInjector,
                   output: ModelRunnerOutput) -> None:
    """Fill ``output.spec_token_ids`` for the requests of ``req_ids`` that sampled this step
    without error; a request whose proposal fails alone is finished with that error
    (``output.errors``, fault stage ``propose``)."""
    rows = [batch.req_id_to_index[r] for r in req_ids
            if r in output.sampled_token_ids and r not in output.errors and r in batch.req_id_to_index]
    if rows:
        _propose_rows(proposer, batch, sorted(rows), faults, output)


def _propose_rows(proposer: Proposer, batch: Any, rows: list[int], faults: FaultInjector,
                  output: ModelRunnerOutput) -> None:
    req_ids = [batch.req_ids[row] for row in rows]
    try:
        faults.check("propose", req_ids)
        drafts = proposer.propose(batch, rows)
    except Exception as exc:  # noqa: BLE001 - isolated below
        if len(rows) > 1:
            mid = len(rows) // 2
            _propose_rows(proposer, batch, rows[:mid], faults, output)
            _propose_rows(proposer, batch, rows[mid:], faults, output)
            return
        logger.exception("proposing drafts for request %s failed; the others go on", req_ids[0])
        output.errors[req_ids[0]] = f"{type(exc).__name__}: {exc}"
        return
    for req_id, draft in zip(req_ids, drafts):
        if len(draft):
            output.spec_token_ids[req_id] = [int(t) for t in np.asarray(draft).tolist()]


def build_proposer(config: Any, **kwargs: Any) -> Proposer:
    """The proposer of ``config.method`` (``SpeculativeConfig``); ``kwargs`` go to its
    constructor (``max_model_len``; the draft model's ``draft``, ``num_blocks``, ...).

    Raises:
        ValueError: no proposer is registered under that method.
    """
    import kvserve.spec_decode.draft_model  # noqa: F401 - registers
    import kvserve.spec_decode.ngram_proposer  # noqa: F401 - registers

    cls = PROPOSERS.get(config.method)
    if cls is None:
        raise ValueError(f"no proposer for method {config.method!r}; registered: {', '.join(sorted(PROPOSERS))}")
    return cls.from_config(config, **kwargs)
