import pytest

from kvserve.errors import InvalidRequestError, RequestRejectedError
from kvserve.request import RequestStatus


def test_queue_full_rejection_changes_nothing(make_scheduler, make_request):
    # Two free running slots plus two queue places: the fifth request is refused.
    scheduler = make_scheduler(max_num_waiting=2, max_num_seqs=2)
    for name in "abcd":
        scheduler.add_request(make_request(name, range(5)))
    with pytest.raises(RequestRejectedError) as info:
        scheduler.add_request(make_request("e", range(5)))
    assert info.value.reason == "queue_full"
    assert "2 requests queued, at most 2 allowed" in info.value.message
    assert [r.request_id for r in scheduler.waiting] == list("abcd") and "e" not in scheduler.requests
    assert scheduler.get_num_unfinished_requests() == 4
    scheduler.schedule()  # a and b start: the queue holds c and d, still full
    with pytest.raises(RequestRejectedError):
        scheduler.add_request(make_request("e", range(5)))


def test_scheduler_checks_only_kv_fit_and_ids(make_scheduler, make_request):
    """Context length and every other value are the input processor's; the scheduler refuses a
    request the whole KV cache cannot hold and ids that are not new, and queues nothing then."""
    scheduler = make_scheduler(num_blocks=26, block_size=4)  # 25 usable blocks = 100 tokens
    with pytest.raises(InvalidRequestError) as info:
        scheduler.add_request(make_request("a", range(90), max_tokens=11))
    assert info.value.message == (
        "prompt (90 tokens) + max_tokens (11) needs 26 KV blocks of 4 tokens; the whole KV cache has 25"
    )
    assert info.value.param == "max_tokens"
    scheduler.add_request(make_request("ok", range(90), max_tokens=10))  # exactly 100 fits
    with pytest.raises(ValueError, match="must be new and distinct"):
        scheduler.add_request(make_request("ok", range(3)))
    with pytest.raises(ValueError, match="must be new and distinct"):
        scheduler.add_requests([make_request("x", range(3)), make_request("x", range(3))])
    assert list(scheduler.requests) == ["ok"] and len(scheduler.waiting) == 1


def test_add_requests_is_all_or_none(make_scheduler, make_request):
    scheduler = make_scheduler(num_blocks=5, block_size=4, max_num_waiting=8)
    with pytest.raises(InvalidRequestError, match="needs 5 KV blocks"):
        scheduler.add_requests([make_request("a", range(3)), make_request("b", range(10), max_tokens=7)])
    assert scheduler.requests == {} and len(scheduler.waiting) == 0


def test_request_larger_than_cache_is_rejected(make_scheduler, make_request):
    scheduler = make_scheduler(num_blocks=5, block_size=4)  # 4 usable blocks = 16 tokens
    with pytest.raises(InvalidRequestError, match="needs 5 KV blocks of 4 tokens; the whole KV cache has 4"):
        scheduler.add_request(make_request("a", range(10), max_tokens=7))
    scheduler.add_request(make_request("b", range(10), max_tokens=6))
    assert scheduler.waiting.peek().status == RequestStatus.WAITING


def test_chunked_prefill_off_needs_budget_for_max_model_len(make_scheduler):
    with pytest.raises(ValueError, match="max_num_batched_tokens \\(64\\) must be >= max_model_len \\(256\\)"):
        make_scheduler(enable_chunked_prefill=False)


def test_group_capacity_is_checked_for_all_requests_at_once():
    from kvserve.config import SchedulerConfig
    from kvserve.scheduler.admission import check_queue_capacity

    config = SchedulerConfig(max_model_len=64, max_num_seqs=2, max_num_waiting=3)
    check_queue_capacity(0, 0, config, num_new=5)  # 2 start at once, 3 wait: fits exactly
    with pytest.raises(RequestRejectedError) as info:
        check_queue_capacity(1, 0, config, num_new=5)  # one already queued
    assert info.value.reason == "queue_full" and "this request adds 5" in info.value.message
    check_queue_capacity(3, 2, config, num_new=0)
    with pytest.raises(InvalidRequestError) as never:
        check_queue_capacity(0, 0, config, num_new=6, param="prompt")
    assert never.value.param == "prompt"
    assert never.value.message.startswith("this request needs 6 engine requests (prompts x n); at most 5")
