"""One model step end to end: forward pass, sampling, per-request generators, prompt logprobs."""

from __future__ import annotations

import torch

from kvserve.model.runner import ModelRunner
from kvserve.outputs import ModelRunnerOutput, PromptLogprobs
from kvserve.request import Request
from kvserve.sample.logprobs import prompt_logprobs_from_logits
from kvserve.sample.metadata import SamplingMetadata
from kvserve.sample.sampler import Sampler
from kvserve.scheduler.output import ScheduledRequest, SchedulerOutput


class ModelExecutor:
    """Executes a ``SchedulerOutput`` on a ``ModelRunner`` and samples.

    Each request with a ``seed`` gets its own ``torch.Generator``, created on first sight and kept
    until the request finishes (across preemptions), so a seeded request draws the same numbers
    whatever else is in the batch. Unseeded requests share one engine generator seeded with
    ``seed``.

    Prompt logprobs: logits row ``i`` of a step computing tokens ``[c, c + n)`` scores prompt
    token ``c + i + 1``; a recompute after preemption scores positions again, and the scheduler
    passes each position on once.
    """

    def __init__(self, runner: ModelRunner, vocab_size: int, seed: int = 0):
        self.runner = runner
        self.vocab_size = vocab_size
        self.device = runner.device
        self.sampler = Sampler(generator=torch.Generator(device=self.device).manual_seed(seed))
        self._generators: dict[str, torch.Generator] = {}

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run the step; returns sampled tokens (and logprobs) keyed by request id."""
        for request_id in scheduler_output.finished_request_ids:
            self._generators.pop(request_id, None)
        output = ModelRunnerOutput()
        if scheduler_output.is_empty:
            return output
        wanting = self._wanting_prompt_logprobs(scheduler_output.scheduled)
        if wanting:
            step = self.runner.execute_model_with_prompt_logits(scheduler_output, set(wanting))
            logits = step.logits
            for scheduled in wanting.values():
                output.prompt_logprobs[scheduled.request_id] = self._prompt_logprobs(
                    scheduled, step.prompt_logits[scheduled.request_id]
                )
        else:
            logits = self.runner.execute_model(scheduler_output)
        sampling = [s.request for s in scheduler_output.scheduled if s.samples]
        if not sampling:
            return output
        generators = [self._generator(r) for r in sampling]
        metadata = SamplingMetadata.build(sampling, generators, self.vocab_size, self.device)
        sampled = self.sampler(logits, metadata)
        token_ids = sampled.sampled_token_ids.tolist()
        for request, token_id, logprobs in zip(sampling, token_ids, sampled.logprobs):
            output.sampled_token_ids[request.request_id] = token_id
            if logprobs is not None:
                output.logprobs[request.request_id] = logprobs
        return output

    def _generator(self, request: Request) -> torch.Generator | None:
        seed = request.sampling_params.seed
        if seed is None or request.sampling_params.is_greedy:
            return None
        generator = self._generators.get(request.request_id)
        if generator is None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
            self._generators[request.request_id] = generator
        return generator

    @staticmethod
    def _wanting_prompt_logprobs(scheduled: list[ScheduledRequest]) -> dict[str, ScheduledRequest]:
        """Requests asking for prompt logprobs whose step scores at least one prompt token."""
        return {
            s.request_id: s for s in scheduled
            if s.request.sampling_params.prompt_logprobs is not None
            and s.num_computed_tokens < s.request.num_prompt_tokens - 1
        }

    @staticmethod
    def _prompt_logprobs(scheduled: ScheduledRequest, logits: torch.Tensor) -> PromptLogprobs:
        """Logits row i (position c + i) scores prompt token c + i + 1, up to the last one."""
        request = scheduled.request
        start = scheduled.num_computed_tokens
        end = min(start + scheduled.num_new_tokens, request.num_prompt_tokens - 1)
        targets = request.prompt_token_ids[start + 1 : end + 1]
        entries = prompt_logprobs_from_logits(logits[: end - start], targets, request.sampling_params.prompt_logprobs)
        return PromptLogprobs(start + 1, entries)
