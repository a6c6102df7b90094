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


def test_split_says_where_a_new_request_would_go():
    fcfs = create_request_queue("fcfs")
    a, b, c, preempted = req("a", arrival_time=1.0), req("b", arrival_time=3.0), req("c", arrival_time=5.0), req("p", arrival_time=9.0)
    for request in (c, a, b):
        fcfs.add(request)
    fcfs.prepend(preempted)  # resumes first whatever its arrival
    before, after = fcfs.split(req("new", arrival_time=3.0))  # ties go after the queued
    assert [r.request_id for r in before] == ["p", "a", "b"] and [r.request_id for r in after] == ["c"]
    priority = create_request_queue("priority")
    for request in (req("low", 2, 0.0), req("high", 0, 5.0), req("mid", 1, 1.0)):
        priority.add(request)
    before, after = priority.split(req("new", 1, 0.5))
    assert [r.request_id for r in before] == ["high"] and [r.request_id for r in after] == ["mid", "low"]
