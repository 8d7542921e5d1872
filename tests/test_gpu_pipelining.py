"""A GPU's next batch sent a round trip before its batch in flight ends (the default policy only).

The dispatch core on a fake clock: it learns the executor's round trip from the answers of
batches sent to an idle GPU, queues one batch behind the running one at that lead, lets the
executor refuse it late, and leaves the papers' baselines and a trip-free simulation as they
were. Then the GPU busy time that /metrics reads, and the simulator's executor, which runs a
queued batch only after the one before it.
"""

from __future__ import annotations

import random

import pytest

from gateway.gpu_cluster import GpuClusterWindow
from gateway.tools.simulate import SimModel, Simulation
from schedulers.dispatch import EXECUTOR_FAILED, GPU, Batch, DispatchCore, Fail, Finish, Start, WakeAt
from schedulers.gpu import DEFAULT_POLICY, GpuScheduler
from schedulers.profiles import LatencyProfile
from schedulers.request import Request
from schedulers.round_robin import RandomRoundRobin

L_MS = 10.0  # every batch of one request takes 10 ms on the GPU
TRIP_S = 0.0015  # and its answer comes 1.5 ms after that


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def gpu_core(policy: str = DEFAULT_POLICY, max_batch: int = 1) -> DispatchCore:
    """One GPU executor, one model served on it alone, ``max_batch`` requests at a time, SLA 100 ms."""
    core = DispatchCore(cpu_scheduler=RandomRoundRobin(random.Random(1)), gpu_scheduler=GpuScheduler(policy))
    core.add_executor("gpu-0", GPU)
    core.add_model(
        "m", sla_ms=100, max_batch=max_batch, max_queue_size=100, drop_late=True, gpu_profile=LatencyProfile(L_MS, 0.0)
    )
    core.set_executor_ready("gpu-0", True, 0.0)
    return core


def started(actions) -> Batch:
    (start,) = of(actions, Start)
    return start.batch


def learn_the_trip(core: DispatchCore) -> float:
    """One request served on the idle GPU, its answer TRIP_S after l(b): returns the time then."""
    first = started(core.on_arrival(Request(1, "m", 0.0), 0.0))
    assert first.begins is None
    done_at = L_MS / 1000 + TRIP_S
    core.on_batch_done(first, L_MS, done_at)
    return done_at


def test_the_round_trip_is_learned_from_a_batch_sent_to_an_idle_gpu():
    core = gpu_core()
    assert core.gpu_round_trip_s == 0.0
    learn_the_trip(core)
    assert core.gpu_round_trip_s == pytest.approx(TRIP_S)


def test_a_busy_gpu_gets_its_next_batch_a_round_trip_before_its_batch_ends():
    core = gpu_core()
    now = learn_the_trip(core)
    sent = core.on_arrival(Request(2, "m", now), now)
    running = started(sent)
    assert running.expected_end == pytest.approx(now + L_MS / 1000)

    # A request behind it is not sent at once; a wake-up a round trip before the end was asked for.
    actions = core.on_arrival(Request(3, "m", now + 0.001), now + 0.001)
    assert not of(actions, Start)
    due = running.expected_end - TRIP_S
    assert min(w.time for w in of(sent + actions, WakeAt)) == pytest.approx(due)

    queued = started(core.on_timer(due))
    assert queued.begins == pytest.approx(running.expected_end)
    assert queued.expected_end == pytest.approx(running.expected_end + L_MS / 1000)
    assert queued.latest_start == pytest.approx(queued.requests[0].deadline - L_MS / 1000)
    assert core.executors["gpu-0"].queued is queued

    # The running batch's answer comes 1 ms late: the queued one began then, and is not sent again.
    answered = running.expected_end + 0.001
    actions = core.on_batch_done(running, L_MS, answered)
    assert of(actions, Finish) and not of(actions, Start)
    gpu = core.executors["gpu-0"]
    assert gpu.batch is queued and gpu.queued is None
    assert queued.expected_end == pytest.approx(answered + L_MS / 1000)
    assert gpu.free_at(answered) == pytest.approx(queued.expected_end)


@pytest.mark.parametrize("policy", ["roma", "edf", "work_conserving", "deferral", "round_robin"])
def test_the_papers_baselines_hand_a_batch_only_to_a_free_gpu(policy):
    core = gpu_core(policy)
    now = learn_the_trip(core)
    running = started(core.on_arrival(Request(2, "m", now), now))
    actions = core.on_arrival(Request(3, "m", now + 0.001), now + 0.001)
    assert not of(actions, Start)
    actions = core.on_timer(running.expected_end - TRIP_S)
    assert not of(actions, Start)
    assert started(core.on_batch_done(running, L_MS, running.expected_end + TRIP_S)).begins is None


def test_a_batch_that_could_still_grow_waits_for_the_gpu_to_be_free():
    """Chosen a trip early, a batch short of its model's max_batch would leave out what arrives
    in that trip: the GPU takes it once free, with what arrived meanwhile."""
    core = gpu_core(max_batch=4)
    now = learn_the_trip(core)
    running = started(core.on_arrival(Request(2, "m", now), now))
    core.on_arrival(Request(3, "m", now + 0.001), now + 0.001)
    assert not of(core.on_timer(running.expected_end - TRIP_S), Start)
    late_comer = Request(4, "m", running.expected_end - 0.0005)  # within the trip
    assert not of(core.on_arrival(late_comer, late_comer.arrival), Start)

    following = started(core.on_batch_done(running, L_MS, running.expected_end + TRIP_S))
    assert following.begins is None
    assert [r.id for r in following.requests] == [3, 4]


def test_a_batch_cut_short_by_a_request_that_does_not_stack_is_not_sent_ahead():
    """Two requests fill a batch of 2 only if their inputs stack: one of another shape would
    leave a batch of one, which could still grow, so the GPU takes its next batch once free."""
    core = gpu_core(max_batch=2)
    now = learn_the_trip(core)
    running = started(core.on_arrival(Request(2, "m", now), now))
    core.on_arrival(Request(3, "m", now + 0.001, batch_key=("a",)), now + 0.001)
    core.on_arrival(Request(4, "m", now + 0.002, batch_key=("b",)), now + 0.002)
    assert not of(core.on_timer(running.expected_end - TRIP_S), Start)
    assert core.executors["gpu-0"].queued is None

    # Two that stack are a full batch: sent ahead.
    core = gpu_core(max_batch=2)
    now = learn_the_trip(core)
    running = started(core.on_arrival(Request(2, "m", now), now))
    core.on_arrival(Request(3, "m", now + 0.001, batch_key=("a",)), now + 0.001)
    core.on_arrival(Request(4, "m", now + 0.002, batch_key=("a",)), now + 0.002)
    queued = started(core.on_timer(running.expected_end - TRIP_S))
    assert [r.id for r in queued.requests] == [3, 4] and queued.begins is not None


def test_without_a_round_trip_a_gpu_gets_its_next_batch_once_free():
    """The simulator without a dispatch delay answers exactly at l(b): nothing changes there."""
    core = gpu_core()
    first = started(core.on_arrival(Request(1, "m", 0.0), 0.0))
    core.on_batch_done(first, L_MS, L_MS / 1000)
    assert core.gpu_round_trip_s < 1e-4
    running = started(core.on_arrival(Request(2, "m", 0.02), 0.02))
    actions = core.on_arrival(Request(3, "m", 0.021), 0.021)
    assert not of(actions, Start)
    assert all(w.time > running.expected_end for w in of(actions, WakeAt))
    assert started(core.on_batch_done(running, L_MS, running.expected_end)).begins is None


def test_a_queued_batch_refused_late_is_refused_with_the_reason_and_the_running_one_is_kept():
    core = gpu_core()
    now = learn_the_trip(core)
    running = started(core.on_arrival(Request(2, "m", now), now))
    late_one = Request(3, "m", now + 0.001)
    core.on_arrival(late_one, now + 0.001)
    queued = started(core.on_timer(running.expected_end - TRIP_S))

    # The executor read it after its latest start (the batch before it hung): it comes back.
    refused_at = queued.latest_start + 0.001
    actions = core.on_batch_late(queued, refused_at)
    gpu = core.executors["gpu-0"]
    assert gpu.batch is running and gpu.queued is None
    # Past its latest start no device can finish it: refused, with the reason, not lost.
    (refusal,) = of(actions, Fail)
    assert refusal.requests == (late_one,) and refusal.outcome == "refused_deadline"
    assert "after its latest start time" in refusal.message
    assert core.queue_length("m") == 0 and not of(actions, Start)


def pipelined_pair(core: DispatchCore) -> tuple[Batch, Batch, float]:
    """A running batch on gpu-0 and one queued behind it; the time the queued one was sent."""
    now = learn_the_trip(core)
    running = started(core.on_arrival(Request(2, "m", now), now))
    core.on_arrival(Request(3, "m", now + 0.001), now + 0.001)
    sent_at = running.expected_end - TRIP_S
    queued = started(core.on_timer(sent_at))
    assert queued.begins is not None and core.executors["gpu-0"].queued is queued
    return running, queued, sent_at


def test_a_failed_executor_fails_its_running_batch_and_gives_the_queued_one_to_another_gpu():
    """The executor reads a queued batch only once it has answered the one before: when it
    fails during that one, the queued batch never began, and its requests are served elsewhere."""
    core = gpu_core()
    core.add_executor("gpu-1", GPU)
    running, queued, sent_at = pipelined_pair(core)
    # gpu-1 comes up only now; the queued batch was sent while no GPU was idle.
    core.set_executor_ready("gpu-1", True, sent_at)
    failed_at = sent_at + 0.0005
    core.set_executor_ready("gpu-0", False, failed_at)  # the supervisor sees the process gone first
    actions = core.on_batch_failed(running, failed_at, 503, EXECUTOR_FAILED, "executor gpu-0 failed")

    (failure,) = of(actions, Fail)
    assert failure.requests == running.requests and failure.status == 503
    again = started(actions)
    assert again.executor == "gpu-1" and again.requests == queued.requests
    assert core.executors["gpu-0"].batch is None and core.executors["gpu-0"].queued is None
    # The executor's own report of the queued batch comes after: it changes nothing, not even
    # where it says some of its requests ran (a batch run a request at a time): they were taken back.
    assert core.on_batch_failed(queued, failed_at, 503, EXECUTOR_FAILED, "executor gpu-0 failed", queued.requests[:1]) == []
    assert core.executors["gpu-1"].batch is again
    finished = of(core.on_batch_done(again, L_MS, again.expected_end + TRIP_S), Finish)
    assert finished[0].requests == queued.requests


def test_a_queued_batch_whose_executor_failed_waits_in_its_queue_for_the_executor_to_come_back():
    """With no other GPU, the queued batch's requests wait for the restart, as new arrivals do."""
    core = gpu_core()
    running, queued, sent_at = pipelined_pair(core)
    core.set_executor_ready("gpu-0", False, sent_at)
    actions = core.on_batch_failed(running, sent_at, 503, EXECUTOR_FAILED, "executor gpu-0 failed")
    assert [f.requests for f in of(actions, Fail)] == [running.requests] and not of(actions, Start)
    assert core.queue_length("m") == 1
    again = started(core.set_executor_ready("gpu-0", True, sent_at + 0.02))
    assert again.executor == "gpu-0" and again.requests == queued.requests and again.begins is None


def test_a_queued_batch_reported_failed_before_the_one_it_waited_behind_is_taken_back_too():
    core = gpu_core()
    core.add_executor("gpu-1", GPU)
    running, queued, sent_at = pipelined_pair(core)
    core.set_executor_ready("gpu-1", True, sent_at)
    actions = core.on_batch_failed(queued, sent_at + 0.0005, 503, EXECUTOR_FAILED, "executor gpu-0 failed")
    assert not of(actions, Fail)
    assert started(actions).executor == "gpu-1" and started(actions).requests == queued.requests
    actions = core.on_batch_failed(running, sent_at + 0.0006, 503, EXECUTOR_FAILED, "executor gpu-0 failed")
    assert [f.requests for f in of(actions, Fail)] == [running.requests] and not of(actions, Start)


def test_an_executor_whose_failure_arrives_before_it_is_reported_down_gets_none_of_its_queued_batch():
    """An executor on a worker is reported down only by its worker, after its batches' failures
    reach the core: sent there again at once, the requests would fail with it."""
    core = gpu_core()
    running, queued, sent_at = pipelined_pair(core)
    hung_at = sent_at + 0.01
    actions = core.on_batch_failed(running, hung_at, 503, EXECUTOR_FAILED, "executor gpu-0 hung")
    assert not of(actions, Start) and core.queue_length("m") == 1
    core.set_executor_ready("gpu-0", False, hung_at)
    again = started(core.set_executor_ready("gpu-0", True, hung_at + 0.01))
    assert again.requests == queued.requests


def test_a_model_error_leaves_the_queued_batch_to_its_executor():
    """A batch the model refused (400) leaves the executor running: the queued batch runs there."""
    core = gpu_core()
    running, queued, sent_at = pipelined_pair(core)
    actions = core.on_batch_failed(running, running.expected_end, 400, "model_error", "bad input")
    assert of(actions, Fail)[0].requests == running.requests and not of(actions, Start)
    assert core.executors["gpu-0"].batch is queued
    assert of(core.on_batch_done(queued, L_MS, queued.expected_end), Finish)[0].requests == queued.requests


def test_batches_served_while_a_gpu_is_idle_leave_no_entries_behind():
    """The heaps of batch ends are read only while no GPU is idle; served with one GPU always
    idle, a long run must not keep an entry for every batch (a gateway runs for weeks)."""
    core = gpu_core()
    core.add_executor("gpu-1", GPU)
    core.set_executor_ready("gpu-1", True, 0.0)
    now = 0.0
    for i in range(1000):
        batch = started(core.on_arrival(Request(i, "m", now), now))
        now += L_MS / 1000 + TRIP_S
        core.on_batch_done(batch, L_MS, now)
        now += 0.001
    assert core.gpu_round_trip_s == pytest.approx(TRIP_S)
    assert len(core._gpu_ends) <= 2 and len(core._pipeline_ends) <= 2


def test_the_gpu_busy_time_counts_a_pipelined_gpu_as_busy_from_first_send_to_last_answer():
    window = GpuClusterWindow(opened_at=0.0, period_s=10.0)
    window.batch_started("gpu-0", 1.0)
    window.batch_started("gpu-0", 1.009)  # the next batch, sent before the first's answer
    window.batch_ended("gpu-0", 1.010)
    assert window.busy_s(1.015) == pytest.approx(0.015)  # the second runs on
    window.batch_ended("gpu-0", 1.020)
    assert window.busy_s(1.030) == pytest.approx(0.020)


def test_the_simulated_executor_runs_a_queued_batch_after_the_one_before_it():
    """With a dispatch delay the default pipelines; every GPU still runs one batch at a time."""
    model = SimModel("m", sla_ms=200, gpu=(L_MS, 0.0), max_batch=1, drop_late=True)
    simulation = Simulation([model], gpus=1, policy=DEFAULT_POLICY, gpu_dispatch_ms=1.0, seed=3)
    runs: list[tuple[float, float]] = []
    execute = simulation._execute

    def record(batch, now):
        if batch.device == GPU:
            runs.append((now, now + L_MS * batch.rows / 1000))
        execute(batch, now)

    simulation._execute = record
    arrivals = [(i * 0.009, "m") for i in range(300)]  # more than the GPU's 100 requests a second
    simulation.run(arrivals, duration_s=3.0)
    assert simulation.core.gpu_round_trip_s > 1e-4
    gaps = [start - previous_end for (_, previous_end), (start, _) in zip(runs, runs[1:], strict=False)]
    assert min(gaps) > -1e-9  # never two batches at once on the GPU
    # Back to back, where without the pipeline each batch would begin a dispatch delay after the last.
    assert sum(gap < 1e-9 for gap in gaps) > 0.5 * len(gaps)


def test_the_simulated_executor_receives_its_batches_in_the_order_sent():
    """Each batch's trip is drawn apart; a queued batch with a short trip must still not overtake
    the batch it was sent behind, as one connection to the executor keeps them in order. (3 ms
    batches and a 2 ms mean trip: drawn apart, about 3% of them overtook.)"""
    model = SimModel("m", sla_ms=200, gpu=(3.0, 0.0), max_batch=1, drop_late=True)
    simulation = Simulation([model], gpus=1, policy=DEFAULT_POLICY, gpu_dispatch_ms=2.0, seed=3)
    order: list[int] = []
    execute = simulation._execute

    def record(batch, now):
        if batch.device == GPU:
            order.append(batch.id)
        execute(batch, now)

    simulation._execute = record
    simulation.run([(i * 0.0028, "m") for i in range(1000)], duration_s=3.0)
    assert len(order) > 500
    assert order == sorted(order)
