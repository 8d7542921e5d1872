"""Ours on a fake clock: the feed-forward controller, the SLA measures, the deficit-ordered grant
and the spill signal (no engine, no executor; a fluid queue plays the plant)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controllers.base import Window
from controllers.feedforward import IDLE_PERIODS, MAX_UTILISATION, FeedForwardController, feed_forward_cores
from controllers.pi import PIController, plant_gain
from controllers.sla_measure import DEADLINE_PERCENTILE, SlaMeasure
from gateway.config import ControlConfig
from gateway.control import ControlLoop
from supervisor.arbitration import arbitrate, arbitrate_by_deficit
from supervisor.node import NodeSupervisor
from tests.test_control_core import Recorder, gateway_config, model

SLA_MS = 40.0
SERVICE_S = 0.004  # CPU seconds a request
ALPHA = 0.5


def period(
    cores: float, rate: float, backlog: float, service_s: float = SERVICE_S, measured_s: float = SERVICE_S
) -> tuple[Window, float]:
    """One second of a fluid queue served at ``cores``: what completed, at what mean response
    time (M/M/1 when it keeps up, the backlog's wait when it does not), and the backlog left;
    the executor's CPU time says ``measured_s`` a request."""
    capacity = cores / service_s
    served = min(backlog + rate, capacity)
    left = backlog + rate - served
    if left < 1e-9 and rate < capacity:
        rt_ms = service_s / (cores - rate * service_s) * 1000
    else:
        rt_ms = ((backlog + left) / 2 * service_s / cores + service_s) * 1000
    count = int(round(served))
    window = Window(count=count, total_ms=rt_ms * count, cpu_s=count * measured_s, times_ms=[rt_ms] * count)
    window.waiting = int(left)
    window.oldest_wait_ms = left * service_s / cores * 1000 if left >= 1 else None
    return window, left


def drive(controller, rates, *, cores=0.3, service_s=SERVICE_S, measured_s=None, sla_ms=SLA_MS):
    """Run ``controller`` on the fluid queue through ``rates`` (one a period): per period the
    mean response time, and the cores granted for the next."""
    backlog, trace = 0.0, []
    for rate in rates:
        window, backlog = period(cores, rate, backlog, service_s, measured_s or service_s)
        sla = sla_ms(len(trace)) if callable(sla_ms) else sla_ms
        cores = controller.demand(window, sla)
        controller.granted(cores)
        trace.append((window.mean_ms, cores))
    return trace


def ours(**kwargs) -> FeedForwardController:
    return FeedForwardController(initial_cores=0.3, min_cores=0.05, max_cores=1.5, setpoint_ratio=ALPHA, **kwargs)


def romas(service_s: float = SERVICE_S) -> PIController:
    # ROMA's CT at the same set point, its gain identified as the control loop does.
    return PIController(
        initial_cores=0.3, min_cores=0.05, max_cores=1.5, setpoint_ratio=ALPHA, k=plant_gain(SLA_MS, ALPHA, service_s)
    )


def periods_over(trace, start: int, sla_ms: float = SLA_MS) -> int:
    """Periods from ``start`` until the mean is under the SLA and stays there."""
    over = [i for i, (mean, _) in enumerate(trace) if i >= start and mean is not None and mean > sla_ms]
    return over[-1] - start + 1 if over else 0


def test_feed_forward_sizes_an_mm1_queue_for_its_target():
    # 100 req/s of 2 ms at a 30 ms target: s (lambda + sqrt(lambda) + 1 / T), no excess backlog.
    assert feed_forward_cores(100, 0.002, 0.030, 0, 1.0) == pytest.approx(0.002 * (100 + 10 + 1 / 0.030))
    # 50 waiting where Little's law expects 110 x 0.03 = 3.3: the excess is drained in a period.
    assert feed_forward_cores(100, 0.002, 0.030, 50, 1.0) == pytest.approx(0.002 * (110 + 1 / 0.030 + 50 - 3.3))
    # The M/M/1 mean at those cores (without the headroom) is the target.
    cores = feed_forward_cores(100, 0.002, 0.030, 0, 1.0) - 0.002 * 10
    assert 0.002 / (cores - 100 * 0.002) == pytest.approx(0.030)


def test_a_4x_step_is_met_in_the_period_after_it_where_romas_pi_takes_longer():
    # A 1 ms model from 100 to 400 req/s: 0.3 more cores, where ROMA's PI moves at most
    # K x 4 = 4 s / (alpha SLA) = 0.2 core a period.
    rates = [100.0] * 10 + [400.0] * 10
    mine, theirs = drive(ours(), rates, service_s=0.001), drive(romas(0.001), rates, service_s=0.001)
    # Period 10 is the step itself (nobody has seen it yet); ours is under the SLA from period 11 on.
    assert periods_over(mine, 10) == 1
    assert periods_over(theirs, 10) > periods_over(mine, 10)
    # At steady state ours is under the set point: at 400 req/s the M/M/1 cores for 20 ms would
    # be 0.85 busy, so it plans MAX_UTILISATION's instead (lambda' s / 0.75).
    assert mine[-1][0] < ALPHA * SLA_MS
    assert mine[-1][1] == pytest.approx(0.001 * (400 + math.sqrt(400)) / MAX_UTILISATION, rel=0.01)


def test_no_correction_plans_the_cores_busier_than_the_utilisation_cap():
    # A 2 ms model at 120 req/s whose windows all read far under the 0.8 x 45 ms set point (the
    # PI would give back down to half the feed-forward): the cores stay at lambda' s / 0.75.
    controller = FeedForwardController(initial_cores=0.4, min_cores=0.05, max_cores=1.5, setpoint_ratio=0.8)
    for _ in range(20):
        window = Window(count=120, total_ms=120 * 3.0, cpu_s=120 * 0.002, times_ms=[3.0] * 120)
        cores = controller.demand(window, 45.0)
        controller.granted(cores)
    assert controller.correction < 0
    assert cores == pytest.approx(0.002 * (120 + math.sqrt(120)) / MAX_UTILISATION)


def test_a_correction_learnt_at_a_busy_load_never_takes_the_time_one_request_needs():
    # 120 req/s of a 4 ms model whose windows read far under the 20 ms set point: the PI gives
    # back cores. Then 4 req/s: a request alone, at quota speed, takes s / c, so the cores stay
    # at least s / T (0.2) and half the work over it, where a cut of half the feed-forward left
    # 0.11 (a 36 ms request on its own).
    controller = ours()
    for _ in range(10):
        busy = Window(count=120, total_ms=120 * 2.0, cpu_s=120 * SERVICE_S, times_ms=[2.0] * 120)
        controller.granted(controller.demand(busy, SLA_MS))
    assert controller.correction < 0
    target_s = ALPHA * SLA_MS / 1000
    for _ in range(3):
        quiet = Window(count=4, total_ms=4 * 2.0, cpu_s=4 * SERVICE_S, times_ms=[2.0] * 4)
        cores = controller.demand(quiet, SLA_MS)
        controller.granted(cores)
        work = SERVICE_S * (4 + math.sqrt(4))
        assert cores >= SERVICE_S / target_s + work / 2 - 1e-9


def test_an_idle_model_is_at_its_minimum_within_five_periods():
    # A 0.5 ms model: ROMA's PI gives back at most K / 2 = s / (2 alpha SLA), 0.0125 core a period.
    rates = [400.0] * 10 + [0.0] * 6
    mine, theirs = drive(ours(), rates, service_s=0.0005), drive(romas(0.0005), rates, service_s=0.0005)
    first_at_min = next(i for i, (_, cores) in enumerate(mine) if i >= 10 and cores == 0.05)
    assert first_at_min - 10 + 1 == IDLE_PERIODS <= 5
    # One quiet period does not throw every core away at once.
    assert mine[10][1] > 0.05
    assert theirs[14][1] > 0.05  # ROMA's PI is still above the minimum five periods on


def test_a_halved_sla_is_planned_for_in_the_next_period():
    controller = ours()
    trace = drive(controller, [60.0] * 15, sla_ms=lambda p: SLA_MS if p < 10 else SLA_MS / 2)
    before, after = trace[9][1], trace[10][1]
    # The target halves: s / T doubles (the arrival term stays).
    assert after - before == pytest.approx(SERVICE_S / (ALPHA * SLA_MS / 2000) - SERVICE_S / (ALPHA * SLA_MS / 1000), rel=0.05)
    assert periods_over(trace, 10, SLA_MS / 2) <= 1


def test_the_pi_corrects_what_the_model_misses():
    # The queue really takes 1.5x the CPU time measured (throttling, threads): the feed-forward
    # alone under-provisions; the correction brings the mean to the set point.
    controller = ours()
    trace = drive(controller, [60.0] * 30, service_s=1.5 * SERVICE_S, measured_s=SERVICE_S)
    assert controller.correction > 0
    assert trace[-1][0] == pytest.approx(ALPHA * SLA_MS, rel=0.05)


def test_no_windup_while_the_node_grants_less():
    controller = ours()
    window, _ = period(0.3, 60.0, 0.0)
    controller.demand(window, SLA_MS)
    controller.granted(0.3)
    late = Window(count=60, total_ms=60 * 4 * SLA_MS, cpu_s=60 * SERVICE_S, times_ms=[4 * SLA_MS] * 60)
    controller.demand(late, SLA_MS)
    controller.granted(0.1)  # the supervisor could give only 0.1 of what was asked
    correction = controller.correction
    controller.demand(late, SLA_MS)
    assert controller.correction == correction  # the shortfall of the node is not integrated


def test_react_raises_the_demand_when_work_arrives_faster_than_the_cores_drain():
    controller = ours()
    window, _ = period(0.3, 30.0, 0.0)
    controller.granted(controller.demand(window, SLA_MS))
    granted = controller.feed_forward + controller.correction
    # Half a period in: 80 requests reached the executor, 20 completed, 60 wait.
    spill = Window(count=20, total_ms=20 * 10.0, waiting=60, oldest_wait_ms=300.0)
    raised = controller.react(spill, SLA_MS, 0.5)
    assert raised is not None and raised > 1.25 * granted
    assert controller.react(Window(count=15, total_ms=150.0), SLA_MS, 0.5) is None  # the usual 30 req/s
    assert controller.react(spill, SLA_MS, 0.05) is None  # too short a stretch to tell a rate
    assert ours().react(spill, SLA_MS, 0.5) is None  # nothing measured yet: no prediction


def test_react_reads_no_rise_into_the_poisson_noise_of_a_fifth_of_a_period():
    # 60 req/s, a fifth of a period in: 20 arrivals where 12 are expected read 100 a second at
    # face value, 1.36x the cores; one standard deviation of their noise under that, 78 a second,
    # is 1.16x, under REACT_MARGIN. 30 arrivals in the same fifth are a rise either way.
    controller = ours()
    window, _ = period(0.3, 60.0, 0.0)
    controller.granted(controller.demand(window, SLA_MS))
    assert controller.react(Window(count=20, total_ms=20 * 20.0), SLA_MS, 0.2) is None
    # The same 20, 5 of them still waiting where Little's law expects 2.2: no noise, a rise.
    assert controller.react(Window(count=15, total_ms=15 * 20.0, waiting=5, oldest_wait_ms=30.0), SLA_MS, 0.2) is not None
    raised = controller.react(Window(count=30, total_ms=30 * 20.0), SLA_MS, 0.2)
    assert raised is not None and raised > 1.25 * controller.feed_forward


def test_under_the_mean_the_cpu_is_held_to_what_keeps_both_devices_mean_at_the_set_point():
    # ROMA's tau_R (equation 1) averages the model's requests on both devices. Set point 20 ms
    # (alpha 0.5 of 40 ms); 10 requests on the CPU.
    controller = ours()
    window = Window(count=10, total_ms=250.0, times_ms=[25.0] * 10)
    assert controller.cpu_sla_ms(window, SLA_MS) == SLA_MS  # the GPUs answered none

    def with_gpu(count: int, each_ms: float) -> Window:
        return replace(window, times_ms=list(window.times_ms), gpu_count=count, gpu_total_ms=count * each_ms)

    # 10 GPU answers at 10 ms leave the CPU's 10 a mean of (20 x 20 - 100) / 10 = 30 ms.
    assert controller.cpu_sla_ms(with_gpu(10, 10.0), SLA_MS) == pytest.approx(30.0 / ALPHA)
    # Never past the SLA itself, however fast the GPUs were.
    assert controller.cpu_sla_ms(with_gpu(500, 1.0), SLA_MS) == pytest.approx(SLA_MS / ALPHA)
    # GPU answers over the set point are not the CPU's to win back: the plain target.
    assert controller.cpu_sla_ms(with_gpu(10, 35.0), SLA_MS) == SLA_MS
    # The percentile and deadline measures hold every request: the plain target.
    for measure in (SlaMeasure("percentile", 95.0), SlaMeasure("deadline")):
        assert ours(measure=measure).cpu_sla_ms(with_gpu(10, 10.0), SLA_MS) == SLA_MS

    # The same CPU load asks for fewer cores when the GPUs answered the rest faster.
    def cores_after(gpu_each_ms: float | None) -> float:
        controller, cores, backlog = ours(), 0.3, 0.0
        for _ in range(6):
            window, backlog = period(cores, 40.0, backlog)
            if gpu_each_ms is not None:
                window.gpu_count, window.gpu_total_ms = 40, 40 * gpu_each_ms
            cores = controller.demand(window, SLA_MS)
            controller.granted(cores)
        return cores

    assert cores_after(5.0) < 0.9 * cores_after(None)
    assert cores_after(35.0) == pytest.approx(cores_after(None))


def test_sla_measures():
    window = Window()
    for rt in [10.0] * 98 + [50.0, 60.0]:
        window.add(rt)
    assert not SlaMeasure("mean").violated(window, 40.0)  # mean 10.9 ms
    assert SlaMeasure("percentile", 99.5).violated(window, 40.0)
    assert not SlaMeasure("percentile", 95).violated(window, 40.0)
    assert SlaMeasure("deadline").violated(window, 40.0)  # two requests ended past it
    assert SlaMeasure("percentile", 99).mean_target_ms(46.05) == pytest.approx(46.05 / math.log(100), rel=1e-6)
    assert SlaMeasure("deadline").planned_percentile == DEADLINE_PERCENTILE
    # A percentile measure plans more cores for the same load than the mean does.
    rates = [60.0] * 5
    mean_cores = drive(ours(), rates)[-1][1]
    p99_cores = drive(ours(measure=SlaMeasure("percentile", 99)), rates)[-1][1]
    assert p99_cores > mean_cores
    with pytest.raises(ValueError):
        SlaMeasure("median")  # type: ignore[arg-type]


def test_the_deficit_grant_serves_the_models_furthest_behind_first():
    demands = {"a": 1.0, "b": 1.0, "c": 0.5}
    deficits = {"a": 0.5, "b": 3.0, "c": 1.5}
    granted = arbitrate_by_deficit(demands, deficits, 2.0, min_cores={"a": 0.1, "b": 0.1, "c": 0.1})
    # Minimums first (0.3); the 1.7 left shared by (demand - minimum) x deficit (a's 0.5 counted
    # as 1): weights 0.9, 2.7, 0.6 give b 1.09, past its demand: b gets 1.0 whole, and the 0.8
    # left goes to a and c as 0.9 : 0.6.
    assert granted == pytest.approx({"b": 1.0, "a": 0.1 + 0.8 * 0.6, "c": 0.1 + 0.8 * 0.4})
    assert sum(granted.values()) == pytest.approx(2.0)
    proportional = arbitrate(demands, 2.0, min_cores={"a": 0.1, "b": 0.1, "c": 0.1})
    assert proportional["b"] < 1.0  # Algorithm 2 leaves every model short, b included
    # Without contention it is Algorithm 2 exactly.
    assert arbitrate_by_deficit(demands, deficits, 4.0, spare_share=0.5) == arbitrate(demands, 4.0, spare_share=0.5)


def test_the_deficit_grant_starves_no_model_when_every_one_is_behind():
    # AllApps on CPUs alone: every demand at the node's 1.5 cores, every model behind.
    demands = {name: 1.5 for name in ("s", "m", "l", "xl")}
    deficits = {"s": 3.0, "m": 8.0, "l": 6.0, "xl": 10.0}
    granted = arbitrate_by_deficit(demands, deficits, 1.5, min_cores=dict.fromkeys(demands, 0.05))
    assert sum(granted.values()) == pytest.approx(1.5)
    # Shares follow the deficits; none is left at its floor while another takes the node.
    assert granted["xl"] > granted["m"] > granted["l"] > granted["s"] > 3 * 0.05


def test_the_supervisor_orders_its_grant_by_the_measured_deficit():
    controllers = {name: PIController(initial_cores=1.0, min_cores=0.1, max_cores=2.0) for name in "ab"}
    supervisor = NodeSupervisor(controllers, {"a": 1.0, "b": 1.0}, node_cores=1.5, grant_rule="deficit")
    behind = Window(count=10, total_ms=10 * 300.0)  # b's mean: 300 ms against a 100 ms SLA
    on_target = Window(count=10, total_ms=10 * 50.0)
    allocations = supervisor.step(1.0, {"a": on_target, "b": behind}, {"a": 100.0, "b": 100.0})
    assert allocations["b"].granted == pytest.approx(allocations["b"].demanded)
    assert allocations["a"].granted < allocations["a"].demanded
    with pytest.raises(ValueError):
        NodeSupervisor(controllers, {"a": 1.0, "b": 1.0}, node_cores=1.5, grant_rule="fair")


def test_a_spill_raises_the_cores_at_once_not_at_the_period_end():
    config = gateway_config(model("m", cores=0.3, sla_ms=SLA_MS), model("n", cores=0.3, sla_ms=SLA_MS), policy="feedforward")
    config = replace(config, control=replace(config.control, grant="deficit"))
    assert isinstance(config.control, ControlConfig)
    steady, _ = period(0.3, 30.0, 0.0)
    io = Recorder({"m": steady, "n": steady})
    clock = iter([0.0])
    loop = ControlLoop(config, measure=io.measure, set_cores=io.set_cores, on_period=io.on_period, clock=lambda: next(clock))
    loop.tick(1.0)
    before = io.cores["m"]
    spill = Window(count=20, total_ms=200.0, waiting=60, oldest_wait_ms=300.0)
    assert loop.react("m", lambda: spill, now=1.5)
    assert io.cores["m"] > 1.25 * before  # applied now, half a period before the next tick
    assert not loop.react("m", lambda: spill, now=1.52)  # at most once per tenth of a period
    # A model under another policy has nothing to predict with.
    pi = ControlLoop(
        gateway_config(model("m", cores=0.3, sla_ms=SLA_MS)),
        measure=io.measure,
        set_cores=io.set_cores,
        clock=lambda: 0.0,
    )
    assert not pi.react("m", lambda: spill, now=0.5)
