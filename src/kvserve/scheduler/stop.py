"""Stop conditions checked after each sampled token (token-level only; stop strings are matched by
the front end after detokenizing, which then calls ``Scheduler.finish_requests``)."""

from __future__ import annotations

from kvserve.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """Decide whether ``request`` is finished after its latest token; set its status if so.

    Order: EOS (``request.eos_token_ids``, unless ``ignore_eos``), then ``stop_token_ids`` (these
    two only once ``num_output_tokens >= min_tokens``), then the length caps ``max_tokens`` and
    ``max_model_len``. A stop token on the last allowed position therefore reports ``stop``, not
    ``length``, as OpenAI does. The stop token stays in the output token ids.

    Returns:
        True when finished (status FINISHED_STOPPED, with ``stop_reason`` = the stop token id for
        ``stop_token_ids``, or FINISHED_LENGTH_CAPPED).
    """
    params = request.sampling_params
    output_token_ids = request.output_token_ids
    num_output_tokens = len(output_token_ids)
    last_token_id = output_token_ids[-1]
    if num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and last_token_id in request.eos_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if params.stop_token_ids and last_token_id in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last_token_id
            return True
    if num_output_tokens >= request.max_tokens or len(request.all_token_ids) >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def check_prompt_only_done(request: Request) -> bool:
    """A request that generates no token (``max_tokens == 0``: scoring its prompt, or pooling
    it) finishes once its whole prompt is computed, with ``length``, or ``stop`` for a pooling
    request (vLLM's scheduler: a pooled output is FINISHED_STOPPED); set its status if so.

    Returns:
        True when finished.
    """
    if request.max_tokens == 0 and request.num_computed_tokens >= request.num_prompt_tokens:
        pooled = request.spec.pooling_params is not None
        request.status = RequestStatus.FINISHED_STOPPED if pooled else RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
