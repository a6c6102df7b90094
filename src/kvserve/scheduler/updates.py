"""The scheduler's second half: a step's results applied to its requests, and requests finished
from outside. ``Scheduler`` (``kvserve.scheduler.scheduler``) inherits these methods; they use its
state: ``requests``, ``running``, ``waiting``, ``kv_cache_manager``, ``spec``, ``slo``,
``prompt_logprobs_tracker``, ``num_sent_block_ids``, ``finished_req_ids`` and the counters.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from kvserve.outputs import EngineCoreOutput, ModelRunnerOutput
from kvserve.request import Request, RequestStatus
from kvserve.scheduler.output import SchedulerOutput
from kvserve.scheduler.stop import check_prompt_only_done, check_stop

logger = logging.getLogger(__name__)


class StepUpdates:
    """``update_from_output`` and ``finish_requests`` of the ``Scheduler``."""

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """Apply a step's results: advance ``num_computed_tokens`` (less the rejected draft
        positions), append sampled tokens (a pooling request's vector rides on its finishing
        output), check stop conditions (``stop.check_stop``) after each,
        register newly full blocks in the prefix cache, keep new drafts and free finished
        requests. A request the runner could not process (``runner_output.errors``, or ``refused``:
        by its own fault) finishes with ``error``. Requests aborted since ``schedule()`` are skipped.

        Returns:
            one output per request that got a token or prompt logprobs or finished, in batch
            order.
        """
        outputs = []
        requests = self.requests
        running = RequestStatus.RUNNING
        errors = runner_output.errors
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        sampled = runner_output.sampled_token_ids
        for request_id, num_new in scheduler_output.num_scheduled_tokens.items():
            request = requests.get(request_id)
            if request is None or request.status is not running:
                continue
            refusal = runner_output.refused.get(request_id) if runner_output.refused else None
            error = refusal or (errors.get(request_id) if errors else None)
            new_token_ids = sampled.get(request_id, ())
            if spec_tokens and error is None:
                drafts = spec_tokens.get(request_id)
                if drafts:
                    num_new -= self.spec.num_rejected(request, drafts, len(new_token_ids))
            request.num_computed_tokens += num_new
            if error is None:
                try:
                    output = self._update_request(request, num_new, new_token_ids, runner_output)
                except Exception as exc:  # noqa: BLE001 - this request's failure, not the step's
                    logger.exception("updating request %s failed; the others go on", request_id)
                    error = f"{type(exc).__name__}: {exc}"
            if error is not None:
                output = self._fail(request, error, client_error=refusal is not None)
            if output is not None:
                outputs.append(output)
        return outputs

    def _update_request(self, request: Request, num_new: int, new_token_ids: Sequence[int],
                        runner_output: ModelRunnerOutput) -> EngineCoreOutput | None:
        request_id = request.request_id
        finished = False
        max_model_len = self.scheduler_config.max_model_len
        num_kept = 0
        for token_id in new_token_ids:  # several with accepted drafts: a stop among them ends there
            request.output_token_ids.append(token_id)
            request.all_token_ids.append(token_id)
            self.num_generated_tokens += 1
            num_kept += 1
            finished = check_stop(request, max_model_len)
            if finished:
                break
        new_token_ids = new_token_ids[:num_kept]
        if not new_token_ids:
            finished = check_prompt_only_done(request)
        elif request.slo_state is not None and request.num_output_tokens == num_kept:
            self.slo.on_first_token(request)
        block_size = self.kv_cache_manager.block_size
        computed = request.num_computed_tokens
        if computed // block_size != (computed - num_new) // block_size:  # a block filled up
            self.kv_cache_manager.cache_blocks(request, computed)
        prompt_logprobs = None
        if request.sampling_params.prompt_logprobs is not None:
            prompt_logprobs = self.prompt_logprobs_tracker.filter(request_id,
                                                                  runner_output.prompt_logprobs.get(request_id))
        if finished:
            self.running.remove(request)
            self._release(request)
        elif self.spec is not None:
            self.spec.store_drafts(request, runner_output.spec_token_ids.get(request_id, ()))
        if not new_token_ids and prompt_logprobs is None and not finished:
            return None
        return EngineCoreOutput(
            request_id,
            list(new_token_ids),
            runner_output.logprobs.get(request_id, [])[:num_kept],
            prompt_logprobs,
            request.status.finish_reason if finished else None,
            request.stop_reason if finished else None,
            max(request.num_cached_tokens, 0),
            request.first_scheduled_time,
            num_preemptions=request.num_preemptions if finished else 0,
            num_external_tokens=request.num_external_tokens,
            pooling_output=runner_output.pooler_output.get(request_id) if runner_output.pooler_output else None,
        )

    def _fail(self, request: Request, error: str, client_error: bool = False) -> EngineCoreOutput:
        """Finish a request whose processing failed (``client_error``: by its own fault); the
        step goes on for the others."""
        if request in self.running:
            self.running.remove(request)
        request.status = RequestStatus.FINISHED_ERROR
        request.error = error
        if request.request_id in self.requests:
            self._release(request)
        return EngineCoreOutput(request.request_id, [], finish_reason=request.status.finish_reason,
                                num_cached_tokens=max(request.num_cached_tokens, 0),
                                first_scheduled_time=request.first_scheduled_time, error=error,
                                client_error=client_error, num_preemptions=request.num_preemptions)

    def _release(self, request: Request) -> None:
        if self.spec is not None:
            self.spec.forget(request)
        self.prompt_logprobs_tracker.forget(request.request_id)
        self.num_sent_block_ids.pop(request.request_id, None)
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)
        self.num_finished_requests += 1

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """Finish requests from outside (the client left, or the front end found a stop string
        or failed on the request): their blocks are freed at once, waiting or running. Unknown
        or already finished ids are ignored.

        Raises:
            ValueError: ``status`` is not a finished status.
        """
        if not status.is_finished:
            raise ValueError(f"finish_requests needs a finished status, got {status.name}")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._release(request)
