"""The dispatch core in process, on a fake clock, with fake executors: the exact actions it returns."""

from __future__ import annotations

import gc
import random
import weakref

import pytest

from schedulers.deficit import estimated_response_ms, sla_batch
from schedulers.dispatch import CPU, GPU, TIMEOUTS_COMPACT_MIN, DispatchCore, Fail, Finish, Start, WakeAt
from schedulers.gpu import GpuScheduler
from schedulers.profiles import LatencyProfile
from schedulers.request import Request, RequestQueue
from schedulers.round_robin import RandomRoundRobin


def core_with(
    *,
    gpus: int = 0,
    policy: str = "deferral",
    cpu: bool = True,
    cpu_profile: tuple[float, float] = (1.0, 4.0),
    gpu_profile: tuple[float, float] | None = None,
    sla_ms: float = 100.0,
    max_batch: int = 8,
    max_queue_size: int = 100,
    drop_late: bool = False,
    timeout_s: float = 60.0,
    ready: bool = True,
) -> DispatchCore:
    core = DispatchCore(
        cpu_scheduler=RandomRoundRobin(random.Random(1)),
        gpu_scheduler=GpuScheduler(policy) if gpus else None,
        request_timeout_s=timeout_s,
    )
    if cpu:
        core.add_executor("cpu-m", CPU, "m")
    for i in range(gpus):
        core.add_executor(f"gpu-{i}", GPU)
    core.add_model(
        "m",
        sla_ms=sla_ms,
        max_batch=max_batch,
        max_queue_size=max_queue_size,
        drop_late=drop_late,
        cpu_profile=LatencyProfile(*cpu_profile) if cpu else None,
        gpu_profile=LatencyProfile(*gpu_profile) if gpu_profile else None,
    )
    for executor in core.executors:
        core.set_executor_ready(executor, ready, 0.0)
    return core


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


def test_a_request_runs_at_once_on_a_free_cpu_executor_and_finishes():
    core = core_with()
    request = Request(1, "m", 0.0)
    actions = core.on_arrival(request, 0.0)
    (start,) = of(actions, Start)
    assert start.batch.executor == "cpu-m" and start.batch.requests == (request,)
    assert request.deadline == pytest.approx(0.1)
    # The only timer is the request's timeout (60 s).
    assert of(actions, WakeAt) == [WakeAt(60.0)]
    done = core.on_batch_done(start.batch, 5.0, 0.005)
    assert done[0] == Finish(start.batch, (request,))
    assert core.queue_length("m") == 0


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_batch_whose_time_is_not_its_own_teaches_no_profile(gpus):
    """A batch that the model refused ran again one request at a time: the sum of those runs
    was learned as l(b) (3.5 s for a batch of 8 whose l(8) was 0.8 s), and later batches were cut."""
    core = core_with(gpus=gpus, cpu=not gpus, gpu_profile=(1.0, 4.0) if gpus else None)
    request = Request(1, "m", 0.0)
    (start,) = of(core.on_arrival(request, 0.0), Start)
    profile = core.models["m"].gpu_profile if gpus else core.models["m"].cpu_profile
    before = profile.latency_ms(1)
    done = core.on_batch_done(start.batch, 500.0, 0.5, learn=False)
    assert done[0] == Finish(start.batch, (request,)) and profile.latency_ms(1) == before
    (again,) = of(core.on_arrival(Request(2, "m", 1.0), 1.0), Start)
    core.on_batch_done(again.batch, 500.0, 1.5)
    assert profile.latency_ms(1) == 500.0  # a batch's own time is learned


def test_a_full_queue_refuses_at_once_with_429_and_retry_after():
    core = core_with(max_queue_size=2, ready=False)
    for i in (1, 2):
        assert not of(core.on_arrival(Request(i, "m", 0.0), 0.0), Fail)
    third = Request(3, "m", 0.0)
    (fail,) = of(core.on_arrival(third, 0.0), Fail)
    assert (fail.requests, fail.status, fail.outcome) == ((third,), 429, "queue_full")
    assert dict(fail.headers)["Retry-After"] == "1"
    assert "max_queue_size" in fail.message
    assert core.queue_length("m") == 2


def test_a_request_no_device_can_finish_is_refused_at_admission():
    core = core_with(cpu_profile=(5.0, 40.0), sla_ms=20, drop_late=True)
    request = Request(1, "m", 0.0)
    (fail,) = core.on_arrival(request, 0.0)
    assert (fail.status, fail.outcome) == (503, "refused_deadline")
    assert "45.0 ms" in fail.message  # the fastest device's l(1)


def test_a_refusal_names_what_made_the_request_late():
    """A body that took the SLA to arrive was refused "the fastest device needs 0.2 ms"; a request
    held to its own timeout was refused as missing the SLA."""
    core = core_with(cpu_profile=(0.1, 0.1), sla_ms=100, drop_late=True)
    slow_body = Request(1, "m", 0.0)
    (fail,) = core.on_arrival(slow_body, 0.3)  # reached the queue 300 ms after it arrived
    assert fail.message == (
        "model 'm' cannot answer within its SLA of 100 ms: 300 ms of it had passed when it reached the queue, "
        "and the fastest device needs 0.2 ms for this request; refused before any work was done"
    )
    # Its own timeout of 80 ms fits l(1) of 50 ms, but not behind a batch of 50 ms: refused by
    # that timeout, not by the SLA of 3 s.
    core = core_with(cpu_profile=(0.0, 50.0), sla_ms=3000, drop_late=True)
    assert of(core.on_arrival(Request(2, "m", 1.0), 1.0), Start)
    tight = Request(3, "m", 1.001, timeout_s=0.08)
    (fail,) = of(core.on_arrival(tight, 1.001), Fail)
    assert fail.message == (
        "model 'm' could not serve this request within the request's timeout of 80 ms "
        "(no device could finish it in time); refused before it ran"
    )


def test_a_model_that_admission_refuses_for_good_measures_again():
    """One slow run (an input 1,000 times the usual, of a dynamic shape) read at the window's 99th
    percentile refused every later request of its size, for good: refused, none ran to measure
    anew. After RELEARN_AFTER_S of refusing every request, with none of its work left, the model
    forgets that size's measurements; one that is that slow measures so again."""
    core = core_with(cpu_profile=(0.1, 1.0), sla_ms=400, drop_late=True)
    for i, ms in enumerate((4.0, 4.0, 772.0)):
        (start,) = of(core.on_arrival(Request(i, "m", float(i)), float(i)), Start)
        core.on_batch_done(start.batch, ms, i + ms / 1000)
    assert core.models["m"].cpu_profile.latency_ms(1) > 400
    refused = [bool(of(core.on_arrival(Request(10 + t, "m", 3.0 + t), 3.0 + t), Fail)) for t in range(5)]
    assert refused == [True] * 5  # 3 to 7 s: refused, as Clockwork's admission does
    (start,) = of(core.on_arrival(Request(20, "m", 8.0), 8.0), Start)  # 5 s after the first refusal
    core.on_batch_done(start.batch, 4.0, 8.004)
    assert core.models["m"].cpu_profile.latency_ms(1) == 4.0
    assert of(core.on_arrival(Request(21, "m", 9.0), 9.0), Start)
    # A model that is that slow: measured so again, it refuses again.
    core = core_with(cpu_profile=(0.1, 1.0), sla_ms=400, drop_late=True)
    (start,) = of(core.on_arrival(Request(1, "m", 0.0), 0.0), Start)
    core.on_batch_done(start.batch, 772.0, 0.772)
    assert of(core.on_arrival(Request(2, "m", 1.0), 1.0), Fail)
    (start,) = of(core.on_arrival(Request(3, "m", 6.0), 6.0), Start)
    core.on_batch_done(start.batch, 772.0, 6.772)
    assert of(core.on_arrival(Request(4, "m", 7.0), 7.0), Fail)


def test_relearning_is_per_size_and_only_where_the_measurements_alone_refuse():
    """A model busy with requests of other sizes still measures a refused size anew (one timer
    for the model, reset by any admission, left that size refused for good); a request refused
    for its own tight timeout, or for time gone before it was queued, forgets nothing."""
    core = core_with(cpu_profile=(0.1, 1.0), sla_ms=400, drop_late=True)
    (start,) = of(core.on_arrival(Request(1, "m", 0.0, rows=4), 0.0), Start)
    core.on_batch_done(start.batch, 5.0, 0.005)
    (start,) = of(core.on_arrival(Request(2, "m", 1.0), 1.0), Start)
    core.on_batch_done(start.batch, 772.0, 1.772)
    for t in range(2, 7):  # every second a refused row and an admitted batch of 4
        assert of(core.on_arrival(Request(10 * t, "m", float(t)), float(t)), Fail)
        (start,) = of(core.on_arrival(Request(10 * t + 1, "m", t + 0.5, rows=4), t + 0.5), Start)
        core.on_batch_done(start.batch, 5.0, t + 0.505)
    assert of(core.on_arrival(Request(99, "m", 7.0), 7.0), Start)  # 5 s after its first refusal
    # Its own timeout of 1 ms under l(1) of 5 ms: refused, and the 5 ms measured is kept.
    core = core_with(cpu_profile=(0.1, 1.0), sla_ms=400, drop_late=True)
    (start,) = of(core.on_arrival(Request(1, "m", 0.0), 0.0), Start)
    core.on_batch_done(start.batch, 5.0, 0.005)
    for t in range(1, 9):
        assert of(core.on_arrival(Request(t + 1, "m", float(t), timeout_s=0.001), float(t)), Fail)
    assert core.models["m"].cpu_profile.measured() == {1: 5.0}


def test_an_expired_request_is_a_timeout_on_a_drop_late_model_too():
    core = core_with(drop_late=True)
    (fail,) = core.on_arrival(Request(1, "m", 0.0, timeout_s=1e-6), 0.002)
    assert (fail.status, fail.outcome) == (504, "timeout")


def test_a_queued_request_times_out_and_is_never_run():
    core = core_with(ready=False)
    request = Request(1, "m", 0.0, timeout_s=0.05)
    assert core.on_arrival(request, 0.0) == [WakeAt(0.05)]
    assert core.on_timer(0.049) == [WakeAt(0.05)]  # a timer that fired early asks again
    (fail,) = core.on_timer(0.05)
    assert (fail.requests, fail.status, fail.outcome) == ((request,), 504, "timeout")
    assert "it was not run" in fail.message
    assert core.queue_length("m") == 0
    # The executor comes up: nothing is left to run.
    assert not of(core.set_executor_ready("cpu-m", True, 0.06), Start)


def test_a_request_whose_timeout_passed_before_it_reached_the_queue_is_never_run():
    """Queued with its timeout already past, an idle executor started it and its result was
    discarded (the next request waited behind work no one would get)."""
    core = core_with()
    late = Request(1, "m", 0.0, timeout_s=1e-6)  # 1 us: past once its body was read
    (fail,) = core.on_arrival(late, 0.002)
    assert (fail.requests, fail.status, fail.outcome) == ((late,), 504, "timeout")
    assert fail.message == "timed out after 0.001 ms, before it reached the queue; it was not run"
    (start,) = of(core.on_arrival(Request(2, "m", 0.003), 0.003), Start)  # the executor is free
    assert [r.id for r in start.batch.requests] == [2]


class Inputs:
    """A request's payload, as the engine's parsed request would be (weakly referable)."""


def test_an_ended_request_is_let_go_while_a_waiting_one_still_times_out():
    # Ended requests must not stay reachable from the core until their timeout (60 s here) with
    # their inputs: at 1,000 requests a second that is a minute of arrays, and objects that
    # every full collection of the garbage collector walks while the event loop waits.
    core = core_with()
    core.add_executor("cpu-n", CPU, "n")
    core.add_model("n", sla_ms=100.0, max_batch=8, max_queue_size=100, drop_late=False, cpu_profile=LatencyProfile(1.0, 4.0))
    core.set_executor_ready("cpu-n", False, 0.0)
    waiting = Request(0, "n", 0.0, timeout_s=30.0)
    core.on_arrival(waiting, 0.0)
    payloads = []
    for i in range(1, 1001):
        now = i * 0.01
        inputs = Inputs()
        payloads.append(weakref.ref(inputs))
        (start,) = of(core.on_arrival(Request(i, "m", now, payload=inputs), now), Start)
        assert of(core.on_batch_done(start.batch, 1.0, now + 0.001), Finish)
        del inputs, start
    gc.collect()
    assert sum(ref() is not None for ref in payloads) < TIMEOUTS_COMPACT_MIN
    (fail,) = of(core.on_timer(30.0), Fail)
    assert (fail.requests, fail.status, fail.outcome) == ((waiting,), 504, "timeout")


def test_a_running_request_times_out_and_its_result_is_discarded():
    core = core_with()
    slow, other = Request(1, "m", 0.0, timeout_s=0.05), Request(2, "m", 0.0)
    core.set_executor_ready("cpu-m", False, 0.0)
    core.on_arrival(slow, 0.0)
    core.on_arrival(other, 0.0)
    (start,) = of(core.set_executor_ready("cpu-m", True, 0.001), Start)
    assert start.batch.requests == (slow, other)
    (fail,) = of(core.on_timer(0.05), Fail)
    assert (fail.requests, fail.status) == ((slow,), 504) and "result is discarded" in fail.message
    # The batch ends later: only the request still waiting is answered.
    assert core.on_batch_done(start.batch, 80.0, 0.081)[0] == Finish(start.batch, (other,))


def test_an_executor_that_dies_with_a_batch_in_flight_fails_it_and_the_queue_waits_for_its_return():
    core = core_with()
    first = Request(1, "m", 0.0)
    (start,) = of(core.on_arrival(first, 0.0), Start)
    second = Request(2, "m", 0.001)
    assert not of(core.on_arrival(second, 0.001), Start)  # the executor is busy
    core.set_executor_ready("cpu-m", False, 0.002)
    actions = core.on_batch_failed(start.batch, 0.002, 503, "executor_failed", "executor cpu-m failed: killed")
    (fail,) = of(actions, Fail)
    assert (fail.requests, fail.status, fail.outcome) == ((first,), 503, "executor_failed")
    assert not of(actions, Start) and core.queue_length("m") == 1
    (restart,) = of(core.set_executor_ready("cpu-m", True, 0.5), Start)
    assert restart.batch.requests == (second,)


def test_an_executor_that_dies_partway_through_a_batch_run_a_request_at_a_time_answers_those_it_ran():
    # The model refused the batch; its requests ran alone one after another until the executor
    # died while it ran the second: the first is answered, the second fails 503, and the ones
    # after it, never sent, go back to the queue, ahead of a request that came meanwhile.
    core = core_with(ready=False, sla_ms=10_000.0)
    requests = [Request(i, "m", 0.0) for i in range(4)]
    for request in requests:
        core.on_arrival(request, 0.0)
    (start,) = of(core.set_executor_ready("cpu-m", True, 0.001), Start)
    assert start.batch.requests == tuple(requests)
    later = Request(9, "m", 0.005)
    core.on_arrival(later, 0.005)
    core.set_executor_ready("cpu-m", False, 0.01)
    actions = core.on_batch_failed(start.batch, 0.01, 503, "executor_failed", "killed", answered=requests[:1], unrun=requests[2:])
    assert of(actions, Finish) == [Finish(start.batch, (requests[0],))]
    (fail,) = of(actions, Fail)
    assert (fail.requests, fail.status) == ((requests[1],), 503)
    assert core.queue_length("m") == 3 and not of(actions, Start)  # its only executor is down
    (restart,) = of(core.set_executor_ready("cpu-m", True, 0.02), Start)
    assert restart.batch.requests == (requests[2], requests[3], later)
    # Without unrun, every request not answered fails, as for a batch that failed whole.
    core = core_with(ready=False)
    for request in (requests := [Request(i, "m", 0.0) for i in range(3)]):
        core.on_arrival(request, 0.0)
    (start,) = of(core.set_executor_ready("cpu-m", True, 0.001), Start)
    core.set_executor_ready("cpu-m", False, 0.01)
    actions = core.on_batch_failed(start.batch, 0.01, 503, "executor_failed", "killed", answered=requests[:1])
    assert of(actions, Fail)[0].requests == tuple(requests[1:]) and core.queue_length("m") == 0


def test_requests_whose_inputs_do_not_stack_go_in_separate_batches():
    core = core_with(ready=False)
    a1, b, a2 = (
        Request(1, "m", 0.0, batch_key=("a",)),
        Request(2, "m", 0.0, batch_key=("b",)),
        Request(3, "m", 0.0, batch_key=("a",)),
    )
    for request in (a1, b, a2):
        core.on_arrival(request, 0.0)
    (start,) = of(core.set_executor_ready("cpu-m", True, 0.0), Start)
    assert start.batch.requests == (a1,)  # FIFO: a2 does not overtake b


def test_a_deferred_gpu_batch_wakes_the_core_at_its_sched_at():
    # One GPU, no CPU executor; at 1000 requests/s beta x lambda is 10 requests, so a batch of
    # one waits until sched_at = deadline - l(2).
    core = core_with(gpus=1, cpu=False, gpu_profile=(1.0, 10.0), sla_ms=50)
    for i in range(1000):
        core.models["m"].arrivals.observe(-0.5 + i * 1e-4)  # the rate the GPU scheduler reads
    request = Request(1, "m", 0.0)
    actions = core.on_arrival(request, 0.0)
    sched_at = 0.05 - 0.012
    assert not of(actions, Start)
    assert of(actions, WakeAt) == [WakeAt(pytest.approx(sched_at))]
    (start,) = of(core.on_timer(sched_at), Start)
    assert start.batch.device == GPU and start.batch.requests == (request,)
    assert start.batch.expected_end == pytest.approx(sched_at + 0.011)


def test_the_cpu_takes_only_what_the_gpu_cannot_finish_in_time():
    # The GPU is busy for 30 ms with a batch; a batch of 2 then takes 11 ms. A request with a
    # 60 ms SLA fits the GPU after that batch, so the CPU leaves it; one of 35 ms does not.
    core = core_with(gpus=1, policy="work_conserving", gpu_profile=(1.0, 9.0), cpu_profile=(2.0, 3.0), sla_ms=60)
    core.set_executor_ready("cpu-m", False, 0.0)
    (busy,) = of(core.on_arrival(Request(1, "m", 0.0), 0.0), Start)
    assert busy.batch.device == GPU
    busy.batch.expected_end = 0.030
    core.set_executor_ready("cpu-m", True, 0.0)
    assert not of(core.on_arrival(Request(2, "m", 0.001), 0.001), Start)  # left for the GPU
    core.set_sla("m", 35)
    (spill,) = of(core.on_arrival(Request(3, "m", 0.002), 0.002), Start)
    assert spill.batch.device == CPU
    # The spill takes from the head: the oldest request goes to the CPU.
    assert [r.id for r in spill.batch.requests] == [2]


def two_models_on_one_gpu(spill_within: float) -> DispatchCore:
    """Models a (GPU only) and b (GPU and a CPU executor); the GPU takes 10 ms a request, no fixed cost."""
    core = DispatchCore(
        cpu_scheduler=RandomRoundRobin(random.Random(1)),
        gpu_scheduler=GpuScheduler("work_conserving"),
        spill_within=spill_within,
    )
    core.add_executor("cpu-b", CPU, "b")
    core.add_executor("gpu-0", GPU)
    for name, cpu in (("a", None), ("b", LatencyProfile(1.0, 1.0))):
        core.add_model(name, sla_ms=60, max_batch=8, max_queue_size=100, cpu_profile=cpu, gpu_profile=LatencyProfile(10.0, 0.0))
    core.set_executor_ready("gpu-0", True, 0.0)
    return core


@pytest.mark.parametrize("a_queued", [0, 4])
def test_the_spill_counts_the_other_models_gpu_work_ahead_of_a_request(a_queued):
    # The GPU is busy until 10 ms. b's request (60 ms SLA, due for the GPU within 0.7 of it:
    # 42 ms) would run 10-20 ms on a GPU of its own; behind a's four requests, due before it,
    # at 50-60 ms: the CPU takes it then, and only then.
    core = two_models_on_one_gpu(spill_within=0.7)
    (busy,) = of(core.on_arrival(Request(1, "a", 0.0), 0.0), Start)
    busy.batch.expected_end = 0.010
    for i in range(a_queued):
        assert not of(core.on_arrival(Request(10 + i, "a", 0.0), 0.0), Start)
    core.set_executor_ready("cpu-b", True, 0.0)
    started = of(core.on_arrival(Request(2, "b", 0.001), 0.001), Start)
    if a_queued:
        assert [(s.batch.device, [r.id for r in s.batch.requests]) for s in started] == [(CPU, [2])]
    else:
        assert not started  # left for the GPU


def test_the_gpu_keeps_only_what_it_answers_within_the_spill_share_of_the_sla():
    # Behind a's two requests b's would end at 40 ms: within its 60 ms SLA, but not within
    # 0.5 of it. At 1.0 the GPU keeps it; at 0.5 the CPU takes it.
    for within, device in ((1.0, None), (0.5, CPU)):
        core = two_models_on_one_gpu(spill_within=within)
        (busy,) = of(core.on_arrival(Request(1, "a", 0.0), 0.0), Start)
        busy.batch.expected_end = 0.010
        for i in range(2):
            core.on_arrival(Request(10 + i, "a", 0.0), 0.0)
        core.set_executor_ready("cpu-b", True, 0.0)
        started = of(core.on_arrival(Request(2, "b", 0.0), 0.0), Start)
        assert [s.batch.device for s in started] == ([device] if device else [])


def test_the_gpu_scheduler_does_not_refuse_what_a_cpu_executor_can_still_finish():
    # Issue bug 2: the GPU cannot finish these requests (l(1) = 30 ms against a 20 ms SLA), the
    # CPU can (5 ms each). They must run on the CPU, not be refused as if no device could.
    core = core_with(gpus=1, policy="deferral", gpu_profile=(1.0, 29.0), cpu_profile=(1.0, 4.0), sla_ms=20, drop_late=True)
    first, second = Request(1, "m", 0.0), Request(2, "m", 0.001)
    (start,) = of(core.on_arrival(first, 0.0), Start)
    assert start.batch.device == CPU
    # The CPU is busy until 0.005; the second can still finish there (0.010 < 0.021): it waits.
    actions = core.on_arrival(second, 0.001)
    assert not of(actions, Fail) and not of(actions, Start) and core.queue_length("m") == 1
    (then,) = of(core.on_batch_done(start.batch, 5.0, 0.005)[1:], Start)
    assert then.batch.device == CPU and then.batch.requests == (second,)


def test_a_request_no_device_can_finish_any_more_is_refused_with_the_reason():
    core = core_with(gpus=1, policy="work_conserving", gpu_profile=(1.0, 9.0), cpu_profile=(5.0, 20.0), sla_ms=40, drop_late=True)
    (on_gpu,) = of(core.on_arrival(Request(1, "m", 0.0), 0.0), Start)
    on_gpu.batch.expected_end = 0.100  # the GPU is stuck with a long batch
    (on_cpu,) = of(core.on_arrival(Request(2, "m", 0.001), 0.001), Start)
    assert on_cpu.batch.device == CPU  # the GPU cannot finish it by 0.041; the CPU can (0.026)
    # The third: the GPU starts at 0.1, the CPU at 0.026 and needs 25 ms: 0.051 > 0.042.
    late = Request(3, "m", 0.002)
    (fail,) = of(core.on_arrival(late, 0.002), Fail)
    assert (fail.requests, fail.outcome) == ((late,), "refused_deadline")
    assert "no device could finish it in time" in fail.message


def test_the_deficit_estimate_counts_the_batches_the_queue_will_run_in():
    # Issue bug 4: 64 queued requests with l(1) = 11 ms, l(64) = 74 ms (l(b) = 1 b + 10).
    profile = LatencyProfile(1.0, 10.0)
    queue = RequestQueue.of(Request(i, "m", 0.0) for i in range(64))
    batch = sla_batch(profile, sla_ms=200, max_batch=64)
    assert batch == 64
    estimate = estimated_response_ms(len(queue), queue.mean_wait_ms(0.0), profile, batch)
    assert estimate == pytest.approx(74.0)  # one batch of 64, not 63/2 single-request times ahead
    # One request at a time (B = 1) it is Algorithm 1's sum of the times ahead, plus its own.
    waited = RequestQueue.of(Request(i, "m", -t / 1000) for i, t in enumerate((10, 20, 30)))
    assert estimated_response_ms(3, waited.mean_wait_ms(0.0), LatencyProfile(0.0, 5.0), 1) == pytest.approx(25 + 5)


def test_queue_sums_follow_appends_removals_and_pops():
    queue = RequestQueue()
    requests = [Request(i, "m", float(i), rows=i) for i in range(1, 5)]
    for request in requests:
        queue.append(request)
    queue.remove(requests[1])
    assert (len(queue), queue.rows, queue.mean_wait_ms(10.0)) == (3, 8, pytest.approx((10 - 8 / 3) * 1000))
    queue.popleft()
    queue.appendleft(requests[0])
    assert queue.rows == 8 and [r.id for r in queue] == [1, 3, 4]


def test_the_core_imports_no_io_library():
    # DESIGN.md principle 1: the decisions import no asyncio, aiohttp, onnxruntime or docker,
    # so that serve and simulate can drive the very same objects.
    import subprocess
    import sys

    from tests.helpers import ROOT

    probe = (
        "import sys; import schedulers.dispatch, gateway.tools.simulate; "
        "print(' '.join(m for m in ('asyncio', 'aiohttp', 'onnxruntime', 'docker') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == ""


def test_the_cpu_backlog_counts_what_waits_for_the_cpu_and_its_age():
    # What the CPU controller reads when nothing completes (issue bug 3): queued and running work.
    core = core_with()
    first, second = Request(1, "m", 0.0), Request(2, "m", 0.010)
    core.on_arrival(first, 0.0)  # runs at once
    core.on_arrival(second, 0.010)  # waits behind it
    assert core.cpu_backlog("m", 0.5) == (2, pytest.approx(500.0))
    # With a GPU that can finish the queued request in time, only the running one is CPU work.
    gpu = core_with(gpus=1, policy="work_conserving", gpu_profile=(1.0, 9.0), sla_ms=15)
    (on_gpu,) = of(gpu.on_arrival(Request(1, "m", 0.0), 0.0), Start)
    (on_cpu,) = of(gpu.on_arrival(Request(2, "m", 0.0), 0.0), Start)
    assert (on_gpu.batch.device, on_cpu.batch.device) == (GPU, CPU)  # the GPU frees at 0.010: too late
    gpu.set_sla("m", 200)
    gpu.on_arrival(Request(3, "m", 0.001), 0.001)  # the GPU finishes this one in time: not CPU work
    assert gpu.cpu_backlog("m", 0.002) == (1, pytest.approx(2.0))


def test_a_request_whose_client_left_leaves_the_queue_or_is_discarded():
    core = core_with()
    running, queued = Request(1, "m", 0.0), Request(2, "m", 0.0)
    (start,) = of(core.on_arrival(running, 0.0), Start)
    core.on_arrival(queued, 0.0)
    core.cancel(queued, 0.001)
    assert core.queue_length("m") == 0  # its slot is free at once, and it never runs
    core.cancel(running, 0.002)
    done = core.on_batch_done(start.batch, 5.0, 0.005)
    assert done[0] == Finish(start.batch, ())  # the result is discarded
    assert not of(done, Start)


def test_with_no_device_up_a_request_is_refused_once_no_device_could_finish_it():
    # The GPU executor never comes up (a crash loop). A request with a 20 ms SLA waited for its
    # timeout: it is refused once even the GPU, up at once, could not finish it (l(1) = 6 ms:
    # from 0.014 on), and the core asks to be woken at no time already gone.
    core = core_with(gpus=1, policy="work_conserving", cpu=False, gpu_profile=(1.0, 5.0), sla_ms=20, drop_late=True, ready=False)
    assert not of(core.on_arrival(Request(1, "m", 0.0), 0.0), Fail)
    assert not of(core.on_timer(0.010), Fail)  # a GPU up now could still finish it
    later = Request(2, "m", 0.012)
    core.on_arrival(later, 0.012)
    actions = core.on_timer(0.015)
    (refused,) = of(actions, Fail)
    assert [r.id for r in refused.requests] == [1]
    assert refused.status == 503 and refused.outcome == "refused_deadline"
    assert "no device was up to finish it in time" in refused.message
    assert all(a.time > 0.015 for a in actions if isinstance(a, WakeAt))
    # The next one waits for its own last start (0.026), then goes the same way.
    (second,) = of(core.on_timer(0.027), Fail)
    assert [r.id for r in second.requests] == [2]
    assert core.queue_length("m") == 0


def test_an_executor_gone_for_good_is_forgotten_once_down_and_without_a_batch():
    core = core_with(gpus=2, policy="work_conserving", gpu_profile=(1.0, 5.0))
    (start,) = of(core.on_arrival(Request(1, "m", 0.0), 0.0), Start)
    gone = start.batch.executor
    assert not core.remove_executor(gone)  # up, and running a batch
    core.set_executor_ready(gone, False, 0.001)
    assert not core.remove_executor(gone)  # its batch has not ended
    core.on_batch_done(start.batch, 5.0, 0.006)
    assert core.remove_executor(gone) and gone not in core.executors
    # The others serve on; what arrives goes to them.
    (later,) = of(core.on_arrival(Request(2, "m", 0.01), 0.01), Start)
    assert later.batch.executor != gone
    assert core.remove_executor(gone)  # forgotten already: nothing to do


def test_a_model_given_a_gpu_profile_later_has_its_queue_taken_by_the_gpu():
    """A dispatcher's GPU that came up after its models were profiled: until the model has a GPU
    profile the GPU takes none of it; once given, what is queued goes to the GPU at once."""
    core = core_with(gpus=1, policy="work_conserving", cpu_profile=(1.0, 40.0), sla_ms=200)
    first, second = Request(1, "m", 0.0), Request(2, "m", 0.001)
    (running,) = of(core.on_arrival(first, 0.0), Start)
    assert running.batch.device == CPU
    assert not of(core.on_arrival(second, 0.001), Start)  # the CPU executor is busy, the GPU unused
    (on_gpu,) = of(core.add_gpu_profile("m", LatencyProfile(1.0, 5.0), 0.002), Start)
    assert on_gpu.batch.device == GPU and on_gpu.batch.requests == (second,)
    assert on_gpu.batch.expected_end == pytest.approx(0.002 + 0.006)
    # Given again (a second GPU that came up): nothing changes.
    assert core.add_gpu_profile("m", LatencyProfile(9.0, 9.0), 0.003) == []
    assert core.models["m"].gpu_profile.fixed_ms == 5.0
