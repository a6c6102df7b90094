import pytest

from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.request_queue import FCFSRequestQueue, PriorityRequestQueue, create_request_queue


def req(request_id, priority=0, arrival_time=0.0):
    return Request.of(request_id, [1], SamplingParams(), priority=priority, arrival_time=arrival_time)


def ids(queue):
    return [r.request_id for r in queue]


def test_fcfs_prepend_and_remove():
    queue = create_request_queue("fcfs")
    assert isinstance(queue, FCFSRequestQueue) and not queue
    a, b, c = req("a"), req("b"), req("c")
    queue.add(a)
    queue.add(b)
    queue.prepend(c)
    assert ids(queue) == ["c", "a", "b"] and queue.peek() is c
    queue.remove(a)
    assert queue.pop() is c and ids(queue) == ["b"] and len(queue) == 1


def test_priority_order_ties_and_remove():
    queue = create_request_queue("priority")
    assert isinstance(queue, PriorityRequestQueue)
    for request in [req("late-high", 0, 5.0), req("low", 3, 0.0), req("early-high", 0, 1.0), req("tie", 0, 1.0)]:
        queue.add(request)
    assert ids(queue) == ["early-high", "tie", "late-high", "low"]
    low = [r for r in queue if r.request_id == "low"][0]
    queue.remove(low)
    with pytest.raises(ValueError, match="not waiting"):
        queue.remove(low)
    assert [queue.pop().request_id for _ in range(3)] == ["early-high", "tie", "late-high"]
    with pytest.raises(IndexError):
        queue.peek()


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'; allowed: 'fcfs', 'priority'"):
        create_request_queue("lifo")
