"""CPU batch sizes from the learned CPU profile (schedulers/cpu_batch.py): batch only where a
fixed cost is amortized, never past the head request's deadline; pure calls and the dispatch
core on a fake clock."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from schedulers.cpu_batch import AMORTIZED_SHARE, amortizing_rows, backlog_rows, cpu_batch_rows, dispatch_due, planned_batch_rows
from schedulers.dispatch import CPU, GPU, DispatchCore, Fail, Finish, Start, WakeAt
from schedulers.gpu import GpuScheduler
from schedulers.profiles import LatencyProfile
from schedulers.request import Request
from schedulers.round_robin import RandomRoundRobin


def test_a_linear_profile_batches_nothing():
    # l(b) = 2 b: a batch of 8 saves nothing and makes the head wait 16 ms instead of 2.
    assert cpu_batch_rows(LatencyProfile(2.0, 0.0), 8, 8, math.inf) == 1
    # Noise in the learned fixed cost (0.05 ms against 2 ms a row) does not make a batch either.
    assert cpu_batch_rows(LatencyProfile(2.0, 0.05), 8, 8, math.inf) == 1


def test_a_fixed_cost_heavy_profile_batches_up_to_the_amortization_bound():
    profile = LatencyProfile(1.0, 0.3)  # fixed_ms / (AMORTIZED_SHARE per_item_ms) = 6
    assert AMORTIZED_SHARE == 0.05
    assert amortizing_rows(profile) == pytest.approx(6.0)
    assert cpu_batch_rows(profile, 8, 8, math.inf) == 6
    # ... and never past the rows there are, or the model's max batch.
    assert cpu_batch_rows(profile, 4, 8, math.inf) == 4
    assert cpu_batch_rows(profile, 8, 3, math.inf) == 3
    # A profile that is all fixed cost batches as far as allowed.
    assert cpu_batch_rows(LatencyProfile(0.0, 5.0), 7, 8, math.inf) == 7


def test_the_head_requests_slack_caps_the_batch():
    profile = LatencyProfile(1.0, 0.4)  # amortizes up to 8 rows; l(b) = b + 0.4
    assert cpu_batch_rows(profile, 8, 8, math.inf) == 8
    assert cpu_batch_rows(profile, 8, 8, 5.5) == 5  # l(5) = 5.4 <= 5.5 < l(6)
    # Not even l(1) fits: the head is late whatever the batch, and the batch is the size that
    # ends the queued rows soonest on average. Served alone, every head after a stall was late
    # too, and the queue ran one request at a time (8 rows: 6.3 ms on average); as one batch of
    # the 8 rows that amortize, each waited 8.4 ms; in pairs, 6.0 ms.
    assert cpu_batch_rows(profile, 8, 8, 1.0) == 2
    assert cpu_batch_rows(profile, 8, 8, -20.0) == 2
    # That is for a model whose executors one request at a time fall behind its arrivals (800 a
    # second of 1.4 ms each: 1.12 s of work a second), or only just keep up (700: 0.98 s, never
    # idle). Where they keep up with room (600: 0.84 s; or 1,000 over two executors: 0.7 s
    # each), the late head goes alone.
    assert cpu_batch_rows(profile, 8, 8, 1.0, arrivals_per_s=800.0) == 2
    assert cpu_batch_rows(profile, 8, 8, 1.0, arrivals_per_s=700.0) == 2
    assert cpu_batch_rows(profile, 8, 8, 1.0, arrivals_per_s=600.0) == 1
    assert cpu_batch_rows(profile, 8, 8, 1.0, executors=2, arrivals_per_s=1000.0) == 1
    assert cpu_batch_rows(LatencyProfile(1.0, 0.05), 8, 8, -20.0) == 1  # a linear cost: nothing to amortize
    assert planned_batch_rows(profile, 8, 4, 8, -20.0) == 4


def test_a_late_heads_batch_grows_with_the_backlog_it_serves():
    profile = LatencyProfile(1.0, 0.4)  # amortizes up to 8 rows; l(b) = b + 0.4
    # The mean end l(b) (n/b + 1) / 2 is least near b = sqrt(n 0.4): 1 row queued, 2 of 8, 6 of 100.
    assert [backlog_rows(profile, 8, n) for n in (1, 8, 100)] == [1, 2, 6]
    assert [cpu_batch_rows(profile, n, 8, -1.0) for n in (1, 8, 100)] == [1, 2, 6]
    # A queue that four executors drain together is a quarter of it for each: 32 rows as 8.
    assert cpu_batch_rows(profile, 32, 8, -1.0, executors=4) == 2
    # Never past the rows that amortize, however long the queue.
    assert cpu_batch_rows(profile, 10_000, 64, -1.0) == 8
    # No cost a row: a batch of every row allowed ends them all at once.
    assert cpu_batch_rows(LatencyProfile(0.0, 2.0), 100, 16, -1.0) == 16


def test_the_slack_is_read_against_the_measured_latency_where_there_is_one():
    profile = LatencyProfile(1.0, 0.0)
    for rows, ms in ((2, 4.0), (6, 8.0), (4, 8.0)):
        profile.observe(rows, ms)
    # The fit is l(b) = b + 2.67 (l(6) = 8.67 on the line), but batches of 6 were measured at 8 ms.
    assert profile.fixed_ms == pytest.approx(8 / 3) and profile.latency_ms(6) == 8.0
    assert cpu_batch_rows(profile, 8, 8, 8.0) == 6


def test_without_a_profile_the_batch_is_as_large_as_allowed():
    assert cpu_batch_rows(None, 5, 8, 0.0) == 5
    assert cpu_batch_rows(None, 12, 8, 0.0) == 8


# -- through the dispatch core ---------------------------------------------------------------
def queue_of_eight(cpu_profile: LatencyProfile, sla_ms: float = 1000.0, ready_at: float = 0.0) -> Start:
    """Eight requests queued at t=0 behind an executor that comes up at ``ready_at``: its first Start."""
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)))
    core.add_executor("cpu-m", CPU, "m")
    core.add_model("m", sla_ms=sla_ms, max_batch=8, max_queue_size=100, cpu_profile=cpu_profile)
    for i in range(8):
        core.on_arrival(Request(i, "m", 0.0), 0.0)
    (start,) = [a for a in core.set_executor_ready("cpu-m", True, ready_at) if isinstance(a, Start)]
    return start


def test_a_cpu_executor_takes_one_request_of_eight_under_a_linear_profile():
    start = queue_of_eight(LatencyProfile(1.0, 0.0))
    assert [r.id for r in start.batch.requests] == [0] and start.batch.rows == 1


def test_a_cpu_executor_takes_a_larger_batch_under_a_fixed_cost_profile():
    start = queue_of_eight(LatencyProfile(1.0, 0.25))  # amortizes up to 5 rows
    assert [r.id for r in start.batch.requests] == [0, 1, 2, 3, 4]


def test_the_core_reads_the_slack_from_the_heads_deadline_at_dispatch_time():
    # Amortizes up to 20 rows, but the head (SLA 10 ms) has 6 ms left at t = 4 ms: l(5) = 6.
    start = queue_of_eight(LatencyProfile(1.0, 1.0), sla_ms=10.0, ready_at=0.004)
    assert start.batch.rows == 5


def test_one_by_one_is_weighed_by_the_mean_service_time_not_the_high_percentile():
    profile = LatencyProfile(1.0, 0.4)
    for ms in [1.0] * 9 + [10.0]:  # one slow request in ten, as a CPU quota's throttling makes
        profile.observe(1, ms)
    assert profile.latency_ms(1) > 9.0 and profile.mean_ms(1) == pytest.approx(1.9)
    # 400 requests a second are 0.76 s of work a second at the mean: one executor keeps up one by
    # one, though at the high percentile they would read as 3.6 s.
    assert cpu_batch_rows(profile, 8, 8, 1.0, arrivals_per_s=400.0) == 1
    assert cpu_batch_rows(profile, 8, 8, 1.0, arrivals_per_s=600.0) > 1  # 1.14 s a second


def test_the_core_serves_a_late_head_alone_while_one_by_one_keeps_up():
    # The head (SLA 1 ms) is late at t = 5 ms whatever the batch, and eight requests in the last
    # second are far from the 714 a second that 1.4 ms each can serve: it goes alone. Batches for
    # the queue's mean end (a pair of the eight) had more violating windows in ROMA's experiment.
    start = queue_of_eight(LatencyProfile(1.0, 0.4), sla_ms=1.0, ready_at=0.005)
    assert [r.id for r in start.batch.requests] == [0]


def late_queue_start(arrivals: int, executors: int, max_queue_size: int = 10_000) -> int:
    """``arrivals`` requests over one second (SLA 1 ms, l(b) = b + 0.4 ms, amortizing up to 8
    rows) to ``executors`` ready from the start: the first requests keep them busy and the rest
    queue (those past ``max_queue_size`` are refused). The rows of the batch that follows the
    first one's end, at the second's end."""
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)))
    for i in range(executors):
        core.add_executor(f"cpu-m~{i}", CPU, "m")
    core.add_model("m", sla_ms=1.0, max_batch=8, max_queue_size=max_queue_size, cpu_profile=LatencyProfile(1.0, 0.4))
    for i in range(executors):
        core.set_executor_ready(f"cpu-m~{i}", True, 0.0)
    first = [a for i in range(arrivals) for a in core.on_arrival(Request(i, "m", i / arrivals), i / arrivals)]
    batch = next(a.batch for a in first if isinstance(a, Start))
    # Its time is no measure of a trip: it held the executor for the whole second.
    (start,) = starts(core.on_batch_done(batch, 1.4, 1.0, learn=False))
    return start.batch.rows


def test_the_core_batches_a_late_queue_where_one_by_one_falls_behind_its_arrivals():
    # 800 requests a second of 1.4 ms each are more than one executor serves one by one: every
    # head late, the queue would never drain, so it is batched (for its mean end, at most the 8
    # rows that amortize). 600 a second it serves alone.
    assert late_queue_start(800, executors=1) == 8
    assert late_queue_start(600, executors=1) == 1


def test_a_late_queue_that_two_executors_keep_up_with_goes_one_by_one():
    # 1,000 requests a second are 0.7 s of work a second for each of two executors: alone.
    assert late_queue_start(1000, executors=2) == 1
    assert late_queue_start(1000, executors=1) == 8


def test_requests_refused_at_admission_are_no_arrivals_of_the_late_head_rule():
    # 800 requests in the second, 700 of them refused for a full queue: the 100 admitted are the
    # load, which one executor serves one by one. Counted with the refused, it was batched.
    assert late_queue_start(800, executors=1, max_queue_size=99) == 1


def test_a_model_on_cpu_and_gpu_has_one_arrival_rate_of_admitted_requests():
    # The GPU scheduler's lambda (Symphony Section 4.3) and the late CPU head's rate are one
    # count: the core's, of the requests it admits (the core counted refused ones too).
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)), gpu_scheduler=GpuScheduler("deferral"))
    core.add_executor("cpu-m", CPU, "m")
    core.add_executor("gpu-0", GPU)
    profile = LatencyProfile(1.0, 0.4)
    core.add_model("m", sla_ms=1000.0, max_batch=8, max_queue_size=3, cpu_profile=profile, gpu_profile=profile)
    answers = [a for i in range(10) for a in core.on_arrival(Request(i, "m", 0.001 * i), 0.001 * i)]
    assert sum(isinstance(a, Fail) and a.status == 429 for a in answers) == 7
    assert core.models["m"].arrivals.per_second(0.01) == 3
    assert core.gpu_scheduler.models["m"].rate.per_second(0.01) == 3


def late_queue_of_rows(arrivals: int, rows: int) -> int:
    """``arrivals`` requests of ``rows`` rows each over one second (SLA 1 ms, l(b) = b + 4 ms, so
    up to 80 rows amortize) to one executor: the requests in the batch that follows the first
    one's end, at the second's end."""
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)))
    core.add_executor("cpu-m", CPU, "m")
    core.add_model("m", sla_ms=1.0, max_batch=64, max_queue_size=10_000, cpu_profile=LatencyProfile(1.0, 4.0))
    core.set_executor_ready("cpu-m", True, 0.0)
    first = [a for i in range(arrivals) for a in core.on_arrival(Request(i, "m", i / arrivals, rows=rows), i / arrivals)]
    batch = next(a.batch for a in first if isinstance(a, Start))
    (start,) = starts(core.on_batch_done(batch, 4.0 + rows, 1.0, learn=False))  # no trip of a second
    return len(start.batch.requests)


def test_one_by_one_service_of_a_late_queue_is_weighed_at_the_rows_each_request_brings():
    # 120 requests a second of 8 rows: alone, each takes l(8) = 12 ms, 1.44 s of work a second
    # for one executor, so the late queue is batched. Weighed at l(1) = 5 ms (0.6 s a second)
    # they seemed to keep up, and went one by one behind a queue that never drained.
    assert late_queue_of_rows(120, rows=8) > 1
    # 60 a second of 8 rows are 0.72 s of work a second: alone. 120 of 1 row, 0.6 s: alone.
    assert late_queue_of_rows(60, rows=8) == 1
    assert late_queue_of_rows(120, rows=1) == 1


def test_the_late_head_rule_reads_the_mean_rows_of_the_requests():
    profile = LatencyProfile(1.0, 4.0)
    # 100 late requests a second are 100 l(r) of work a second one by one, r their mean rows:
    # at 1 row 0.5 s, at 4 rows (l(4) = 8 ms) 0.8 s of one executor's second: alone. At 6 rows
    # (l(6) = 10 ms), the whole second: batched. The rule read l(1) whatever the rows.
    assert cpu_batch_rows(profile, 600, 64, 1.0, 1, 100.0, 1.0) == 1
    assert cpu_batch_rows(profile, 600, 64, 1.0, 1, 100.0, 4.0) == 1
    assert cpu_batch_rows(profile, 600, 64, 1.0, 1, 100.0, 6.0) > 1
    # A mean of 5.4 rows (60 % of the requests of 5, 40 % of 6) is l = 9.4 ms on average: 0.94 s.
    assert cpu_batch_rows(profile, 600, 64, 1.0, 1, 100.0, 5.4) > 1
    # And what each request holds its executor beyond its compute: 150 a second of l(1) = 5 ms
    # are 0.75 s one by one, 0.96 s with a trip of 1.4 ms.
    assert cpu_batch_rows(profile, 600, 64, 1.0, 1, 150.0, 1.0) == 1
    assert cpu_batch_rows(profile, 600, 64, 1.0, 1, 150.0, 1.0, trip_ms=1.4) > 1


def closed_loop(clients: int, stall_s: float, seconds: float = 2.0, trip_ms: float = 0.0) -> tuple[list[int], list[float]]:
    """``clients`` that each send their next request the moment their last is answered (a closed
    loop, perf_analyzer's concurrency mode) to one CPU executor, l(b) = b + 4 ms exactly, SLA 20
    ms, each batch answered ``trip_ms`` after its compute; the executor is ready only ``stall_s``
    after their first requests. The rows of each batch, and each request's response time (ms),
    over ``seconds``."""
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)))
    core.add_executor("cpu-m", CPU, "m")
    core.add_model("m", sla_ms=20.0, max_batch=64, max_queue_size=1000, cpu_profile=LatencyProfile(1.0, 4.0))
    ids = iter(range(1_000_000))
    running: list[Start] = []
    for _ in range(clients):
        running += starts(core.on_arrival(Request(next(ids), "m", 0.0), 0.0))
    running += starts(core.set_executor_ready("cpu-m", True, stall_s))
    rows, responses = [], []
    while running:
        (start,) = running
        batch = start.batch
        compute_ms = batch.rows + 4.0
        end = batch.started + (compute_ms + trip_ms) / 1000
        if end > seconds:
            break
        rows.append(batch.rows)
        actions = core.on_batch_done(batch, compute_ms, end)
        running = starts(actions)
        for finish in (a for a in actions if isinstance(a, Finish)):
            for request in finish.requests:
                responses.append((end - request.arrival) * 1000)
                running += starts(core.on_arrival(Request(next(ids), "m", end), end))
    return rows, responses


def test_a_closed_loop_whose_heads_a_stall_made_late_is_batched_back_under_its_sla():
    # After a stall of 100 ms every head is late. Served one by one, 8 clients keep the executor
    # busy all the time (the arrivals are its completions, 200 a second of l(1) = 5 ms: one by
    # one "keeps up") and each request waits for the 7 ahead of it: 40 ms a request for as long
    # as the load lasts, where batches of the 8 take 12 ms.
    rows, responses = closed_loop(8, stall_s=0.1)
    assert max(rows[-10:]) > 1, rows[-20:]
    assert statistics.median(responses[-100:]) < 20.0
    # The same where each batch holds the executor 1 ms beyond its compute (the trip, the
    # engine): read from the compute alone, one by one was 0.83 busy and stayed so, at 48 ms.
    rows, responses = closed_loop(8, stall_s=0.1, trip_ms=1.0)
    assert max(rows[-10:]) > 1, rows[-20:]
    assert statistics.median(responses[-100:]) < 20.0
    # No stall: no head is late, and every request is answered within its SLA.
    rows, responses = closed_loop(8, stall_s=0.0)
    assert max(responses) < 20.0


# -- Harpagon's batch-aware dispatch (a planned batch size) ---------------------------------------
def planned_core(planned: int, sla_ms: float = 100.0) -> DispatchCore:
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)))
    core.add_executor("cpu-m", CPU, "m")
    # l(b) = 2 b + 10 ms: a plan of 4 rows takes 18 ms.
    core.add_model(
        "m", sla_ms=sla_ms, max_batch=8, max_queue_size=100, cpu_profile=LatencyProfile(2.0, 10.0), dispatch_batch=planned
    )
    core.set_executor_ready("cpu-m", True, 0.0)
    return core


def starts(actions) -> list[Start]:
    return [a for a in actions if isinstance(a, Start)]


def test_a_planned_batch_waits_for_its_size_then_leaves_whole():
    core = planned_core(planned=4)
    actions = []
    for i in range(3):
        actions += core.on_arrival(Request(i, "m", i * 0.001), i * 0.001)
        assert not starts(actions), "a free executor took a batch short of its plan"
    # The wake-up asked for is the head's latest start for a full batch: 0.1 - 0.018 s.
    assert min(a.time for a in actions if isinstance(a, WakeAt)) == pytest.approx(0.082)
    (start,) = starts(core.on_arrival(Request(3, "m", 0.003), 0.003))
    assert [r.id for r in start.batch.requests] == [0, 1, 2, 3]


def test_a_planned_batch_leaves_short_when_the_head_can_wait_no_longer():
    core = planned_core(planned=4)
    core.on_arrival(Request(0, "m", 0.0), 0.0)
    core.on_arrival(Request(1, "m", 0.010), 0.010)
    assert not starts(core.on_timer(0.081))
    (start,) = starts(core.on_timer(0.082))
    assert [r.id for r in start.batch.requests] == [0, 1]


def test_without_a_plan_a_free_executor_takes_the_head_at_once():
    core = planned_core(planned=1)
    (start,) = starts(core.on_arrival(Request(0, "m", 0.0), 0.0))
    assert [r.id for r in start.batch.requests] == [0]


def test_planned_rows_and_due_time_pure():
    profile = LatencyProfile(2.0, 10.0)
    assert planned_batch_rows(profile, available_rows=6, planned=4, max_batch=8, slack_ms=100) == 4
    assert planned_batch_rows(profile, available_rows=2, planned=4, max_batch=8, slack_ms=100) == 2
    assert planned_batch_rows(profile, available_rows=6, planned=4, max_batch=8, slack_ms=15) == 2  # l(2) = 14 fits
    assert dispatch_due(profile, queued_rows=4, planned=4, head_deadline=1.0) == -math.inf
    assert dispatch_due(profile, queued_rows=1, planned=4, head_deadline=1.0) == pytest.approx(0.982)
    assert dispatch_due(None, queued_rows=1, planned=4, head_deadline=1.0) == -math.inf
    # A measured l(4) under l(1): the lone request waits no later than its own last start.
    profile.observe(1, 30.0)
    profile.observe(4, 12.0)
    assert dispatch_due(profile, queued_rows=1, planned=4, head_deadline=1.0) == pytest.approx(0.970)


def test_a_plan_changed_at_run_time_takes_effect_on_what_is_queued():
    core = planned_core(planned=4)
    core.on_arrival(Request(0, "m", 0.0), 0.0)
    core.on_arrival(Request(1, "m", 0.001), 0.001)
    # Two rows wait for a batch of four; a plan of two lets them go at once, whole.
    (start,) = starts(core.set_dispatch_batch("m", 2, 0.002))
    assert [r.id for r in start.batch.requests] == [0, 1]
