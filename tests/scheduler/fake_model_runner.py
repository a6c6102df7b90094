"""A fake model runner that is strict about the KV cache, and helpers to drive a scheduler.

The fake "KV cache" is a dict slot -> value. Like real K/V, the value at position p depends on the
whole prefix: ``kv_value(tokens[: p + 1])``. Each step first writes every scheduled position at its
slot (``block_ids[pos // block_size] * block_size + pos % block_size``), then, for each request
that samples, READS BACK all values from the request's block table and hashes them into the next
token. Any wrong block table, a prefix-cache hit on a block of another prefix, or a block reused
while still needed changes the read-back values, and so the output.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import NamedTuple

from kvserve.kv_cache.manager import KVCacheManager
from kvserve.outputs import ModelRunnerOutput, PromptLogprobsChunk, TokenLogprobs
from kvserve.request import RequestStatus
from kvserve.scheduler.output import SchedulerOutput
from kvserve.scheduler.scheduler import Scheduler

VOCAB_SIZE = 101


def _digest(values: list[int], person: bytes) -> int:
    data = array("q", values).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=7, person=person).digest(), "little")


def kv_value(prefix: list[int]) -> int:
    """The fake K/V of the last token of ``prefix`` (depends on every earlier token)."""
    return _digest(prefix, b"kv")


def next_token(values: list[int], vocab_size: int = VOCAB_SIZE) -> int:
    """The fake model's output from the K/V values of the whole context."""
    return _digest(values, b"logits") % vocab_size


def reference_generate(prompt: list[int], max_tokens: int, eos_token_ids=frozenset()) -> list[int]:
    """What the fake model generates for a prompt run alone, without any cache (the reference)."""
    context = list(prompt)
    output: list[int] = []
    while len(output) < max_tokens:
        token = next_token([kv_value(context[: p + 1]) for p in range(len(context))])
        context.append(token)
        output.append(token)
        if token in eos_token_ids:
            break
    return output


class FakeModelRunner:
    """Executes ``SchedulerOutput`` against a simulated paged KV cache, keeping, like the real
    runner, its own copy of each request's tokens and block table from the scheduler's messages
    (new requests' data once, then per-step deltas), so a wrong or missing delta shows."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.kv: dict[int, int] = {}
        self.requests: dict[str, dict] = {}

    def _slot(self, block_ids: list[int], position: int) -> int:
        return block_ids[position // self.block_size] * self.block_size + position % self.block_size

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        for req_id in scheduler_output.finished_req_ids | scheduler_output.preempted_req_ids:
            self.requests.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.req_id] = {
                "tokens": list(new.spec.prompt_token_ids) + list(new.output_token_ids),
                "num_prompt": len(new.spec.prompt_token_ids), "params": new.spec.sampling_params,
                "max_tokens": new.spec.max_tokens, "block_ids": list(new.block_ids),
                "computed": new.num_computed_tokens,
            }
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            state = self.requests[req_id]
            state["block_ids"].extend(new_blocks)
            state["computed"] = computed

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(scheduler_output)
        written: set[int] = set()
        for req_id, num_new in scheduler_output.num_scheduled_tokens.items():
            state = self.requests[req_id]
            start, block_ids = state["computed"], state["block_ids"]
            assert 0 not in block_ids, f"{req_id} holds the null block: {block_ids}"
            assert len(block_ids) * self.block_size >= start + num_new, "block table too short"
            for position in range(start, start + num_new):
                slot = self._slot(block_ids, position)
                assert slot not in written, f"slot {slot} written twice in one step"
                written.add(slot)
                self.kv[slot] = kv_value(state["tokens"][: position + 1])
        output = ModelRunnerOutput()
        for req_id, num_new in scheduler_output.num_scheduled_tokens.items():
            state = self.requests[req_id]
            end = state["computed"] + num_new
            if state["params"].prompt_logprobs is not None:
                first = max(state["computed"], 1)
                last = min(end, state["num_prompt"])
                output.prompt_logprobs[req_id] = PromptLogprobsChunk(first, [
                    TokenLogprobs(state["tokens"][p], -float(p), 1, [], []) for p in range(first, last)
                ])
            if end < len(state["tokens"]) or state["max_tokens"] == 0:
                continue
            values = [self.kv[self._slot(state["block_ids"], p)] for p in range(end)]
            token = next_token(values)
            state["tokens"].append(token)
            output.sampled_token_ids[req_id] = [token]
            if state["params"].logprobs is not None:
                output.logprobs[req_id] = [TokenLogprobs(token, -0.5, 1, [token], [-0.5])]
        return output


def check_all(scheduler: Scheduler) -> None:
    """Integrity of the KV cache plus scheduler-side invariants."""
    kv: KVCacheManager = scheduler.kv_cache_manager
    kv.check_integrity()
    running_ids = {r.request_id for r in scheduler.running}
    assert set(kv.req_to_blocks) <= running_ids, "a request that is not running holds blocks"
    for request in scheduler.waiting:
        assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert request.num_computed_tokens == 0
    assert len(scheduler.running) <= scheduler.scheduler_config.max_num_seqs


class RunResult(NamedTuple):
    tokens: dict[str, list[int]]  # request id -> output token ids
    reasons: dict[str, str]  # request id -> finish_reason (requests that finished on their own)
    outputs: list[SchedulerOutput]  # every step's plan
    prompt_logprob_ids: dict[str, list[int]]  # request id -> token ids of returned prompt logprobs


def run_steps(scheduler, runner, arrivals=None, aborts=None, max_steps=10_000) -> RunResult:
    """Drive ``scheduler`` until idle. ``arrivals``/``aborts``: step -> requests / request ids."""
    arrivals, aborts = arrivals or {}, aborts or {}
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    prompt_logprob_ids: dict[str, list[int]] = {}
    outputs = []
    last_event = max([*arrivals, *aborts], default=0)
    for step in range(max_steps):
        for request in arrivals.get(step, ()):
            scheduler.add_request(request)
            tokens[request.request_id] = []
            prompt_logprob_ids[request.request_id] = []
        if aborts.get(step):
            scheduler.finish_requests(aborts[step], RequestStatus.FINISHED_ABORTED)
            check_all(scheduler)
        if not scheduler.has_unfinished_requests() and step >= last_event:
            return RunResult(tokens, reasons, outputs, prompt_logprob_ids)
        scheduler_output = scheduler.schedule()
        outputs.append(scheduler_output)
        check_all(scheduler)
        for out in scheduler.update_from_output(scheduler_output, runner.execute(scheduler_output)):
            tokens[out.request_id].extend(out.new_token_ids)
            prompt_logprob_ids[out.request_id].extend(lp.token_id for lp in out.prompt_logprobs or ())
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        check_all(scheduler)
    raise AssertionError(f"not finished after {max_steps} steps")
