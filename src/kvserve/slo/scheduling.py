"""The scheduler's side of latency targets: admission against a predicted TTFT, the waiting order
by deadline, the prefill cap that keeps decoders' TPOT targets, and the cost model fed by every
step. ``Scheduler`` holds one ``SLOScheduling``; without targets it only orders the queue (in
arrival order, exactly first come first served) and learns the step costs.

Admission (``admit``, before anything is queued):

    predicted TTFT = time already waited + predict_first_token(running, waiting ahead, request)
    miss when predicted TTFT > margin x ttft target, or when a decode step with the request's
    row added is predicted slower than margin x its own TPOT target or a running request's

where ``margin`` is ``StepCostModel.margin``: the share of a target plans may fill, learned from
how far the engine's steps have been from their predictions (steps are also planned to it).

A miss with ``on_miss: "reject"`` raises ``RequestRejectedError`` (reason ``slo_unattainable``,
HTTP 429 with ``Retry-After``) naming the prediction and the target; with ``"queue"`` the request is
queued anyway. Before the cost model is ready (``StepCostModel.ready``) nothing is refused.

Steps: while a running request has a TPOT target, a step's prompt tokens are capped so the step
keeps the tightest one (``token_budget``); while TPOT targets have been seen in the last
``TPOT_WINDOW_S``, requests without one hold at most ``UNTARGETED_SHARE`` of the rows a decode step
may have within the tightest of them, and at least one (``may_start``: they always progress, the
rest is kept for targeted requests, which admission then checks against every row).

Order (``Request.queue_key``): the time a request's prompt must start by: ``arrival + TTFT target -
its own predicted prefill time`` for a TTFT target (least slack first); requests without one come
after every targeted request (``UNTARGETED_AFTER_S``, ``kvserve.slo.targets``), in arrival order,
so the queue a targeted request's prediction plays is exactly the targeted requests ahead of it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvserve.errors import RequestRejectedError
from kvserve.slo.cost_model import StepCostModel, StepWork
from kvserve.slo.predictor import Flow, predict_first_token
from kvserve.slo.targets import SLOTarget

if TYPE_CHECKING:
    from kvserve.request import Request
    from kvserve.scheduler.output import SchedulerOutput
    from kvserve.scheduler.scheduler import Scheduler

# Prompt tokens a step takes even when the TPOT cap leaves none, so waiting requests still start.
MIN_PREFILL_TOKENS = 16
# While TPOT targets are about, requests without one hold at most this share of the rows a decode
# step may have within the tightest target: they progress, the rest is kept for targeted requests.
UNTARGETED_SHARE = 0.25
TPOT_WINDOW_S = 30.0  # ... for this long after a TPOT target was last seen
# The reference request of the TTFT a worker publishes for routers (``reference_ttft``).
REFERENCE_PROMPT_TOKENS = 128
REFERENCE_INTERVAL_S = 0.25
REFERENCE_HORIZON_S = 600.0


@dataclass
class RequestSLO:
    """A targeted request's scheduling state (``Request.slo_state``)."""

    start_by: float | None = None  # the queue key of a TTFT target (``Request.queue_key``), else None
    predicted_ttft: float | None = None  # seconds from arrival, at admission (None: model not ready)
    predicted_miss: bool = False


@dataclass
class SLOCounters:
    """Totals since start-up (class or ``request`` -> requests), and the TTFT prediction errors
    not yet reported."""

    refused: dict[str, int] = field(default_factory=dict)  # refused at admission
    queued_predicted_miss: dict[str, int] = field(default_factory=dict)  # accepted with on_miss "queue"
    ttft_errors: list[float] = field(default_factory=list)  # |predicted - actual| / actual


@dataclass(frozen=True)
class SLOStats:
    """What ``SchedulerStats.slo`` reports (``/metrics``, ``/debug/slo``).

    Attributes:
        step_cost: the cost model's fit (``StepCostModel.describe``).
        refused, queued_predicted_miss: totals by class (see ``SLOCounters``).
        ttft_errors: relative TTFT prediction errors of the requests that got their first token
            since the previous snapshot.
        reference_ttft: ``SLOScheduling.reference_ttft`` (seconds; inf past 10 minutes), or None.
    """

    step_cost: dict
    refused: dict[str, int]
    queued_predicted_miss: dict[str, int]
    ttft_errors: tuple[float, ...] = ()
    reference_ttft: float | None = None


class SLOScheduling:
    """See the module docstring.

    Args:
        cost_model: the step-cost model (learned from this engine's steps).
        clock: ``time.time`` (tests pass their own).
    """

    def __init__(self, cost_model: StepCostModel | None = None, clock=time.time):
        self.cost_model = cost_model or StepCostModel()
        self.counters = SLOCounters()
        self._clock = clock
        self._floor_tpot: float | None = None  # the tightest TPOT target seen lately, ms
        self._floor_until = -math.inf  # ... until then
        self._untargeted_rows = 0  # this step's running requests without TPOT target (token_budget)
        self._untargeted_limit: int | None = None  # ... and how many they may be
        self._reference_at = -math.inf
        self._reference_ttft: float | None = None

    # -- admission ---------------------------------------------------------------------------

    def admit(self, requests: list[Request], scheduler: Scheduler) -> None:
        """Check each targeted request's targets and set its queue key (all the requests of a call
        together, before any is queued).

        Raises:
            RequestRejectedError: ``reason="slo_unattainable"``: a request's targets are predicted
                to be missed and it asked to be refused then.
        """
        now = self._clock()
        for request in requests:
            target = request.spec.slo
            if target is None:
                continue
            state = RequestSLO()
            request.slo_state = state
            self._note_tpot(target)
            if not self.cost_model.ready:
                if target.ttft_ms is not None:
                    state.start_by = request.arrival_time + target.ttft_ms / 1000
                continue
            new = self._flow(request, scheduler, cached=True)
            own = self.cost_model.predict(StepWork(new.prefill, 0, new.prefill * (new.length + new.prefill / 2)))
            if target.ttft_ms is not None:
                state.start_by = request.arrival_time + target.ttft_ms / 1000 - own
            waited = max(0.0, now - request.arrival_time)
            horizon = 10 * target.ttft_ms / 1000 if target.ttft_ms is not None else REFERENCE_HORIZON_S
            budget = scheduler.scheduler_config.max_num_batched_tokens
            ahead, behind = self._around(request, scheduler, budget)
            state.predicted_ttft = waited + predict_first_token(
                self.cost_model, [self._flow(r, scheduler) for r in scheduler.running], ahead, new,
                budget=budget, max_seqs=scheduler.scheduler_config.max_num_seqs,
                prefill_cap=self.prefill_cap(scheduler.running, extra=request), horizon=horizon, behind=behind)
            why = self._miss(request, state.predicted_ttft, scheduler, len(ahead))
            if why is None:
                continue
            state.predicted_miss = True
            name = target.slo_class or "request"
            if target.on_miss == "reject":
                self.counters.refused[name] = self.counters.refused.get(name, 0) + 1
                raise self._refusal(why, state.predicted_ttft, target)
            self.counters.queued_predicted_miss[name] = self.counters.queued_predicted_miss.get(name, 0) + 1

    @staticmethod
    def _refusal(why: str, predicted_ttft: float, target) -> RequestRejectedError:
        """The 429: its message, ``Retry-After`` (the predicted lateness, at least 1 s; a minute
        past the prediction's horizon) and the numbers in the error object."""
        finite = math.isfinite(predicted_ttft)
        late = predicted_ttft - target.ttft_ms / 1000 if target.ttft_ms is not None and finite else 1.0
        details = {"predicted_ttft_ms": round(predicted_ttft * 1000, 1) if finite else None,
                   "slo": {"ttft_ms": target.ttft_ms, "tpot_ms": target.tpot_ms}, "slo_class": target.slo_class}
        return RequestRejectedError(why + " (X-SLO-On-Miss: queue or slo.on_miss \"queue\" accepts it anyway)",
                                    reason="slo_unattainable", retry_after=max(1.0, late) if finite else 60.0,
                                    details=details)

    def _miss(self, request: Request, predicted_ttft: float, scheduler: Scheduler, num_ahead: int) -> str | None:
        """Why the request's targets are predicted to be missed, or None."""
        target, margin = request.spec.slo, self.cost_model.margin
        if target.ttft_ms is not None and predicted_ttft * 1000 > margin * target.ttft_ms:
            shown = "more than 10x the target" if math.isinf(predicted_ttft) else f"{predicted_ttft * 1000:.0f} ms"
            return (f"the predicted time to first token ({shown}) does not keep the target slo.ttft_ms="
                    f"{target.ttft_ms:g} (planned within {margin:.0%} of it; {len(scheduler.running)} requests "
                    f"running, {num_ahead} waiting ahead of this one); retry later or send it to another replica")
        rows = min(scheduler.scheduler_config.max_num_seqs, len(scheduler.running) + num_ahead + 1)
        context = sum(r.num_tokens for r in scheduler.running) + request.num_prompt_tokens
        step = self.cost_model.predict(StepWork(0, rows, context))
        tightest = _tightest_tpot_ms(scheduler.running, request)
        if tightest is not None and step * 1000 > margin * tightest:
            whose = "slo.tpot_ms" if tightest == target.tpot_ms else "a running request's"
            return (f"with this request a decode step is predicted to take {step * 1000:.0f} ms, which does not "
                    f"keep the time-per-output-token target of {tightest:g} ms ({whose}; planned within "
                    f"{margin:.0%} of it); retry later or send it to another replica")
        return None

    def _around(self, request: Request, scheduler: Scheduler, budget: int) -> tuple[list[Flow], list[Flow]]:
        """The waiting requests ahead of ``request`` in queue order, and the first ones after it
        (up to a step's budget of prompt tokens)."""
        before, after = scheduler.waiting.split(request)
        behind: list[Flow] = []
        tokens_behind = 0
        for waiting in after:
            if tokens_behind >= budget:
                break
            behind.append(self._flow(waiting, scheduler))
            tokens_behind += behind[-1].prefill
        return [self._flow(r, scheduler) for r in before], behind

    def _flow(self, request: Request, scheduler: Scheduler, cached: bool = False) -> Flow:
        """The request as the prediction plays it (``cached``: credit its prefix-cache hit)."""
        computed = request.num_computed_tokens
        if cached and computed == 0:
            computed = scheduler.kv_cache_manager.get_computed_blocks(request).num_computed_tokens
        left = max(0, request.num_tokens - computed)
        # a running request with all its tokens computed decodes; one of the prompt still prefills
        prefill = left if request.num_output_tokens == 0 or computed < request.num_prompt_tokens else 0
        return Flow(prefill=prefill, decode=max(1, request.max_tokens - request.num_output_tokens), length=computed)

    # -- scheduling --------------------------------------------------------------------------

    def token_budget(self, running: list[Request], budget: int) -> int:
        """The next step's token budget: ``budget``, or less so that the prompt tokens it takes
        keep the decoders' tightest TPOT target (``prefill_cap``). Called once at the start of each
        step's plan (it also prepares ``may_start``)."""
        self._untargeted_limit = self._share_of_rows(running)
        if self._untargeted_limit is not None:
            self._untargeted_rows = sum(1 for r in running if not _has_tpot(r))
        plan = self._prefill_plan(running)
        if plan is None:
            return budget
        cap, decode_rows = plan
        return min(budget, decode_rows + cap)

    def may_start(self, request: Request) -> bool:
        """Whether a waiting request may start in this step: yes for one with a TPOT target (its
        admission checked it) and whenever no TPOT target was seen in the last
        ``TPOT_WINDOW_S``; otherwise requests without one share at most ``UNTARGETED_SHARE``
        of the rows a decode step may have within the tightest recent target (at least one)."""
        if self._untargeted_limit is None or _has_tpot(request):
            return True
        if self._untargeted_rows >= self._untargeted_limit:
            return False
        self._untargeted_rows += 1
        return True

    def _share_of_rows(self, running: list[Request]) -> int | None:
        """How many rows requests without TPOT target may hold now, or None (no limit)."""
        if self._floor_tpot is None or self._clock() > self._floor_until or not self.cost_model.ready:
            return None
        context = sum(r.num_computed_tokens for r in running) / len(running) if running else 0.0
        rows = self.cost_model.rows_within(self.cost_model.margin * self._floor_tpot / 1000, context)
        return max(1, int(UNTARGETED_SHARE * rows))

    def _note_tpot(self, target: SLOTarget) -> None:
        """Remember the tightest TPOT target seen in the last ``TPOT_WINDOW_S``."""
        if target.tpot_ms is None:
            return
        now = self._clock()
        if self._floor_tpot is None or now > self._floor_until or target.tpot_ms <= self._floor_tpot:
            self._floor_tpot, self._floor_until = target.tpot_ms, now + TPOT_WINDOW_S

    def prefill_cap(self, running: list[Request], extra: Request | None = None) -> int | None:
        """Most prompt tokens a step may take so that the decoding requests' steps stay within the
        tightest TPOT target among them (and ``extra``'s), or None when none has one (or the cost
        model is not ready). At least ``MIN_PREFILL_TOKENS``."""
        plan = self._prefill_plan(running, extra)
        return None if plan is None else plan[0]

    def _prefill_plan(self, running: list[Request], extra: Request | None = None) -> tuple[int, int] | None:
        """``(prefill_cap, decode rows)`` of the next step, or None when nothing caps it."""
        if not self.cost_model.ready or (self._floor_tpot is None and extra is None):
            return None  # no TPOT target seen since start: nothing to look for
        tightest = _tightest_tpot_ms(running, extra)
        if tightest is None:
            return None
        decoding = [r for r in running if r.num_computed_tokens >= r.num_prompt_tokens]
        pairs = sum(r.num_computed_tokens for r in decoding) + len(decoding) / 2
        longest = max((r.num_computed_tokens for r in running if r.num_computed_tokens < r.num_prompt_tokens), default=0)
        seconds = self.cost_model.margin * tightest / 1000
        cap = self.cost_model.prefill_tokens_within(seconds, len(decoding), pairs, longest)
        return max(MIN_PREFILL_TOKENS, cap), len(decoding)

    # -- learning and reporting --------------------------------------------------------------

    @staticmethod
    def step_work(scheduler_output: SchedulerOutput, requests: dict[str, Request]) -> StepWork:
        """What a scheduled step computes (before its results advance the requests): prompt tokens,
        decode rows, attention pairs. The engine core observes it with the step's duration."""
        prefill = rows = 0
        pairs = 0.0
        for request_id, n in scheduler_output.num_scheduled_tokens.items():
            request = requests.get(request_id)
            if request is None:
                continue
            computed = request.num_computed_tokens
            pairs += n * (computed + n / 2)
            if computed < request.num_prompt_tokens:
                prefill += n
            else:
                rows += 1
        return StepWork(prefill, rows, pairs)

    def on_first_token(self, request: Request) -> None:
        """Record the prediction's error for a targeted request that just sampled its first token."""
        state = request.slo_state
        if state is None or state.predicted_ttft is None or not math.isfinite(state.predicted_ttft):
            return
        actual = self._clock() - request.arrival_time
        if actual > 0:
            self.counters.ttft_errors.append(abs(state.predicted_ttft - actual) / actual)

    def stats(self, scheduler: Scheduler) -> SLOStats:
        """A snapshot; the TTFT errors are handed over once; the reference prediction is
        refreshed at most every ``REFERENCE_INTERVAL_S``."""
        counters = self.counters
        errors, counters.ttft_errors = tuple(counters.ttft_errors), []
        now = self._clock()
        if now - self._reference_at >= REFERENCE_INTERVAL_S:
            self._reference_at, self._reference_ttft = now, self.reference_ttft(scheduler)
        return SLOStats(self.cost_model.describe(), dict(counters.refused), dict(counters.queued_predicted_miss),
                        errors, self._reference_ttft)

    def reference_ttft(self, scheduler: Scheduler) -> float | None:
        """The predicted TTFT of a request of ``REFERENCE_PROMPT_TOKENS`` prompt tokens arriving
        now behind every waiting request (what a router compares between workers), or None before
        the cost model is ready."""
        if not self.cost_model.ready:
            return None
        config = scheduler.scheduler_config
        return predict_first_token(self.cost_model, [self._flow(r, scheduler) for r in scheduler.running],
                                   [self._flow(r, scheduler) for r in scheduler.waiting],
                                   Flow(REFERENCE_PROMPT_TOKENS, 1, 0), budget=config.max_num_batched_tokens,
                                   max_seqs=config.max_num_seqs, prefill_cap=self.prefill_cap(scheduler.running),
                                   horizon=REFERENCE_HORIZON_S)



def _has_tpot(request: Request) -> bool:
    return request.spec.slo is not None and request.spec.slo.tpot_ms is not None


def _tightest_tpot_ms(running: list[Request], extra: Request | None = None) -> float | None:
    """The smallest TPOT target (ms) among ``running`` and ``extra``, or None when none has one."""
    requests = running if extra is None else [*running, extra]
    return min((r.spec.slo.tpot_ms for r in requests if _has_tpot(r)), default=None)
