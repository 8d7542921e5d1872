"""Request priorities and the client's own deadline (schedulers/priority.py) in the dispatch
core, on a fake clock: where a request joins its model's queue, the bound that keeps a lower
level from starving, and a ``timeout`` tighter than the SLA used by admission and by the GPU's
candidate batch."""

from __future__ import annotations

import random

import pytest

from schedulers.dispatch import CPU, GPU, DispatchCore, Fail, Start
from schedulers.gpu import GpuScheduler
from schedulers.priority import position
from schedulers.profiles import LatencyProfile
from schedulers.request import Request, RequestQueue
from schedulers.round_robin import RandomRoundRobin


def cpu_core(levels: int, bound_ms: float = 1000.0, drop_late: bool = False) -> DispatchCore:
    # One CPU executor, batches of one request (l(b) = 10 b ms: nothing to amortize).
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)))
    core.add_executor("cpu-m", CPU, "m")
    core.add_model(
        "m",
        sla_ms=100.0,
        max_batch=1,
        max_queue_size=100,
        drop_late=drop_late,
        cpu_profile=LatencyProfile(10.0, 0.0),
        priority_levels=levels,
        priority_bound_ms=bound_ms,
    )
    core.set_executor_ready("cpu-m", True, 0.0)
    return core


def started(actions) -> list[int]:
    return [r.id for a in actions if isinstance(a, Start) for r in a.batch.requests]


def run_all(core: DispatchCore, first: list) -> list[int]:
    """Finish each batch in turn (10 ms each) until the queue is empty: the order served."""
    order, pending, now = [], [a for a in first if isinstance(a, Start)], 0.0
    while pending:
        batch = pending.pop(0).batch
        order += [r.id for r in batch.requests]
        now += 0.010
        pending += [a for a in core.on_batch_done(batch, 10.0, now) if isinstance(a, Start)]
    return order


def test_a_higher_level_is_served_before_lower_levels_waiting():
    core = cpu_core(levels=2)
    first = core.on_arrival(Request(1, "m", 0.0, priority=2), 0.0)  # runs at once: the executor is free
    for i, level in ((2, 2), (3, 2), (4, 1), (5, 2), (6, 1)):
        core.on_arrival(Request(i, "m", 0.001 * i, priority=level), 0.001 * i)
    assert run_all(core, first) == [1, 4, 6, 2, 3, 5]


def test_one_level_keeps_the_queue_fifo():
    core = cpu_core(levels=1)
    first = core.on_arrival(Request(1, "m", 0.0), 0.0)
    for i in range(2, 7):
        core.on_arrival(Request(i, "m", 0.001 * i), 0.001 * i)
    assert run_all(core, first) == [1, 2, 3, 4, 5, 6]


def test_a_request_waiting_past_the_bound_is_passed_by_no_later_arrival():
    core = cpu_core(levels=2, bound_ms=15.0)
    first = core.on_arrival(Request(1, "m", 0.0, priority=2), 0.0)
    core.on_arrival(Request(2, "m", 0.001, priority=2), 0.001)
    # At 12 ms request 2 has waited 11 ms (under the bound): a level-1 arrival goes ahead of it.
    core.on_arrival(Request(3, "m", 0.012, priority=1), 0.012)
    # At 17 ms it has waited 16 ms: level 1 queues behind it from now on.
    core.on_arrival(Request(4, "m", 0.017, priority=1), 0.017)
    assert run_all(core, first) == [1, 3, 2, 4]


def test_position_pure():
    queue = [Request(1, "m", 0.0, 0.1, priority=2), Request(2, "m", 0.05, 0.15, priority=2)]
    assert position(queue, Request(3, "m", 0.06, 0.16, priority=2), 0.06, 1.0) == 2  # same level: FIFO
    assert position(queue, Request(4, "m", 0.06, 0.16, priority=1), 0.06, 1.0) == 0  # ahead of both
    assert position(queue, Request(5, "m", 0.06, 0.16, priority=1), 0.06, 0.03) == 1  # request 1 waited 60 ms > 30
    assert position(queue, Request(6, "m", 0.06, 0.12, priority=2), 0.06, 1.0) == 2  # an earlier deadline: still FIFO
    assert position([], Request(7, "m", 0.0), 0.0, 1.0) == 0


def test_a_timeout_tighter_than_the_sla_is_the_deadline_for_admission():
    core = cpu_core(levels=1, drop_late=True)
    # The CPU needs 10 ms; a client timeout of 5 ms cannot be met: refused before any work, with why.
    (fail,) = [a for a in core.on_arrival(Request(1, "m", 0.0, timeout_s=0.005), 0.0) if isinstance(a, Fail)]
    assert fail.status == 503 and "cannot answer within" in fail.message
    # One of 50 ms can: admitted, with its own deadline.
    request = Request(2, "m", 0.0, timeout_s=0.05)
    assert started(core.on_arrival(request, 0.0)) == [2]
    assert request.deadline == 0.05


def gpu_core(levels: int) -> tuple[DispatchCore, Start]:
    """A GPU (l(b) = 10 b + 10 ms), SLA 200 ms, busy with request 1 until 20 ms."""
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)), gpu_scheduler=GpuScheduler("work_conserving"))
    core.add_executor("gpu-0", GPU)
    core.add_model(
        "m",
        sla_ms=200.0,
        max_batch=8,
        max_queue_size=100,
        drop_late=True,
        gpu_profile=LatencyProfile(10.0, 10.0),
        priority_levels=levels,
        priority_bound_ms=1000.0,
    )
    core.set_executor_ready("gpu-0", True, 0.0)
    (start,) = [a for a in core.on_arrival(Request(1, "m", 0.0, priority=levels), 0.0) if isinstance(a, Start)]
    return core, start


def test_a_tighter_own_deadline_keeps_its_place_and_cuts_the_gpu_batch():
    core, start = gpu_core(levels=1)
    core.on_arrival(Request(2, "m", 0.001), 0.001)
    core.on_arrival(Request(3, "m", 0.002), 0.002)
    tight = Request(4, "m", 0.003, timeout_s=0.075)  # its deadline: 78 ms
    core.on_arrival(tight, 0.003)
    assert [r.id for r in core.models["m"].queue] == [2, 3, 4]  # FIFO: a timeout buys no place
    # The GPU is free at 20 ms: all three (l(3) = 40 ms) end at 60 ms, within 78 ms; the batch's
    # latest start is set by request 4's deadline, not by its head's (201 ms).
    (after,) = [a for a in core.on_batch_done(start.batch, 20.0, 0.020) if isinstance(a, Start)]
    assert [r.id for r in after.batch.requests] == [2, 3, 4]
    assert after.batch.latest_start == pytest.approx(0.078 - 0.040)


def test_a_gpu_batch_ends_by_its_earliest_deadline_not_its_heads():
    core, start = gpu_core(levels=2)
    core.on_arrival(Request(2, "m", 0.001, priority=2, timeout_s=0.045), 0.001)  # deadline 46 ms
    core.on_arrival(Request(3, "m", 0.002, priority=1), 0.002)  # deadline 202 ms, goes ahead
    assert [r.id for r in core.models["m"].queue] == [3, 2]
    # From 20 ms a batch of both ends at 50 ms, past request 2's 46 ms: the head's deadline alone
    # would allow it; the batch is cut to the head, and request 2 waits for the next one.
    (after,) = [a for a in core.on_batch_done(start.batch, 20.0, 0.020) if isinstance(a, Start)]
    assert [r.id for r in after.batch.requests] == [3]


def test_a_batch_put_back_returns_to_its_place_and_the_levels_keep_theirs():
    """Put back (a GPU's late action), the batch's request was sorted with the whole queue by
    arrival: the level-1 request queued ahead of two level-2 ones went behind them."""
    core = DispatchCore(
        cpu_scheduler=RandomRoundRobin(random.Random(0)), gpu_scheduler=GpuScheduler("work_conserving"), request_timeout_s=60
    )
    core.add_executor("gpu-0", GPU)
    core.add_model(
        "m", sla_ms=1000, max_batch=1, max_queue_size=100, drop_late=True, gpu_profile=LatencyProfile(0.0, 10.0),
        priority_levels=2, priority_bound_ms=10_000,
    )  # fmt: skip
    core.set_executor_ready("gpu-0", True, 0.0)
    (start,) = [a for a in core.on_arrival(Request(1, "m", 0.0, priority=2), 0.0) if isinstance(a, Start)]
    for i, level in ((2, 2), (3, 2), (4, 1)):
        core.on_arrival(Request(i, "m", 0.001 * i, priority=level), 0.001 * i)
    assert [r.id for r in core.models["m"].queue] == [4, 2, 3]
    (again,) = [a for a in core.on_batch_late(start.batch, 0.005) if isinstance(a, Start)]
    # Request 1 (level 2) goes back ahead of the level-2 requests that came after it, and behind
    # request 4, which went ahead of every level-2 request waiting when it came: 4 runs next.
    assert [r.id for r in again.batch.requests] == [4]
    assert [r.id for r in core.models["m"].queue] == [1, 2, 3]
    # With one level, the queue is FIFO: back to the head.
    fifo = RequestQueue.of([Request(5, "m", 0.2), Request(6, "m", 0.3)])
    fifo.put_back([Request(3, "m", 0.1)])
    assert [r.id for r in fifo] == [3, 5, 6] and fifo.rows == 3
