"""When will a waiting request get its first token? The scheduler's rules played forward with the
step-cost model, from the requests the engine holds now.

Each step (the rules of ``kvserve.scheduler.scheduler``): every decoding request computes one
token; the rest of the token budget (at most ``prefill_cap`` when decoders' TPOT targets cap it)
goes to prompt chunks in order: the running requests' unfinished prompts, then waiting requests in
queue order while a seat (``max_num_seqs``) is free. A request whose prompt completes samples its
first token in that step, then decodes until its ``max_tokens`` (a request may stop earlier at EOS,
so the prediction leans late). Stretches where no prompt can move (no seat, or no budget left over
the decodes) are skipped in one stride to the next request that leaves.

The prediction is the sum of the predicted step times up to the step that completes the request's
prompt; it ignores preemption and prefix-cache hits of the requests ahead of it (its own hit is
credited by the caller).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from kvserve.slo.cost_model import StepCostModel, StepWork


@dataclass
class Flow:
    """A request as the prediction plays it: prompt tokens still to compute, output tokens still
    to generate (its first one included while its prompt is unfinished), tokens computed (its K/V
    in the cache: what its next token attends to)."""

    prefill: int
    decode: int
    length: int


def predict_first_token(model: StepCostModel, running: list[Flow], waiting: list[Flow], new: Flow, *,
                        budget: int, max_seqs: int, prefill_cap: int | None = None,
                        horizon: float = math.inf, behind: list[Flow] = ()) -> float:
    """Seconds from now until ``new`` (queued behind ``waiting``) samples its first token; ``inf``
    once the prediction passes ``horizon`` seconds.

    Args:
        running: the running requests in batch order (decoding ones have ``prefill == 0``).
        waiting: the waiting requests ahead of ``new``, in queue order.
        behind: the first waiting requests after it: they share the budget left in the step that
            completes its prompt (a budget's worth is enough).
        budget: tokens per step (``max_num_batched_tokens``).
        max_seqs: most requests running at once.
        prefill_cap: most prompt tokens per step (the TPOT cap), or None.
    """
    flows = [Flow(f.prefill, f.decode, f.length) for f in running]
    decoders: list[tuple[int, int]] = []  # (last step it decodes in, its computed tokens when it leaves)
    context = 0  # the decoders' computed tokens, summed
    prefilling: deque[Flow] = deque()
    for flow in flows:
        if flow.prefill > 0:
            prefilling.append(flow)
        elif flow.decode > 0:
            heapq.heappush(decoders, (flow.decode - 1, flow.length + flow.decode))
            context += flow.length
    queue = deque([Flow(f.prefill, f.decode, f.length) for f in waiting] + [new]
                  + [Flow(f.prefill, f.decode, f.length) for f in behind])
    seats = len(decoders) + len(prefilling)
    step, elapsed = 0, 0.0
    while elapsed <= horizon:
        rows = len(decoders)
        room = max(0, budget - rows) if prefill_cap is None else max(0, min(budget - rows, prefill_cap))
        pending = sum(f.prefill for f in prefilling)
        while queue and seats < max_seqs and pending < room:  # seats for the next in the queue
            prefilling.append(queue.popleft())
            seats += 1
            pending += prefilling[-1].prefill
        if (room == 0 or not prefilling) and decoders:  # nothing moves but the decodes: stride on
            stride = decoders[0][0] - step + 1
            elapsed += _decode_stretch(model, rows, context, stride)
            context += rows * stride
            step += stride
            context, seats = _leave(decoders, step - 1, context, seats)
            continue
        if not prefilling:  # nothing runs and nothing can start: the request can never be admitted
            return math.inf
        tokens, pairs, done = 0, context + rows / 2, False
        while prefilling and room > 0:
            flow = prefilling[0]
            chunk = min(flow.prefill, room)
            pairs += chunk * (flow.length + chunk / 2)
            flow.prefill -= chunk
            flow.length += chunk
            tokens += chunk
            room -= chunk
            if flow.prefill:
                break
            prefilling.popleft()
            if flow is new:
                done = True
            elif flow.decode > 1:  # it decodes from the next step on, its first token sampled now
                heapq.heappush(decoders, (step + flow.decode - 1, flow.length + flow.decode - 1))
                context += flow.length
            else:
                seats -= 1
        elapsed += model.predict(StepWork(tokens, rows, pairs))
        if done:
            return elapsed if elapsed <= horizon else math.inf
        context += rows
        context, seats = _leave(decoders, step, context, seats)
        step += 1
    return math.inf


def _decode_stretch(model: StepCostModel, rows: int, context: int, steps: int) -> float:
    """Predicted seconds of ``steps`` decode-only steps of ``rows`` rows whose summed computed
    tokens start at ``context`` and grow by ``rows`` a step (a row of c computed tokens attends
    to c + 1/2 on average, as ``SLOScheduling.step_work`` counts it)."""
    first = model.predict(StepWork(0, rows, context + rows / 2))
    growth = model.predict(StepWork(0, rows, context + rows + rows / 2)) - first
    return steps * first + growth * steps * (steps - 1) / 2


def _leave(decoders: list[tuple[int, int]], step: int, context: int, seats: int) -> tuple[int, int]:
    """Drop the decoders whose last step was ``step``; the context and seats left."""
    while decoders and decoders[0][0] <= step:
        _, length = heapq.heappop(decoders)
        context -= length
        seats -= 1
    return context, seats
