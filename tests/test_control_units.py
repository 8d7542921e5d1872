"""Controllers and the node supervisor as plain functions: exact decisions, no clock, no I/O."""

from __future__ import annotations

import math

import control
import numpy as np
import pytest

from controllers.pi import (
    DEFAULT_POLE,
    DEFAULT_ZERO,
    PIController,
    pi_gains,
    plant_gain,
    tracking_error,
)
from controllers.rules import RuleController
from controllers.static import StaticController
from supervisor.arbitration import arbitrate
from supervisor.node import NodeSupervisor, Window


def served(mean_ms: float | None, *, count: int = 10, cpu_s_per_request: float | None = None) -> Window:
    """A period in which ``count`` requests completed at ``mean_ms`` each (None: none completed)."""
    if mean_ms is None:
        return Window()
    return Window(count=count, total_ms=mean_ms * count, cpu_s=(cpu_s_per_request or 0.0) * count)


@pytest.mark.parametrize(
    ("k", "b", "q"), [(1, 0.5, 0.3), (0.5, 0.2, 0.6), (2, 0.8, 0.1), (0.05, -0.3, 0.9), (10, DEFAULT_ZERO, DEFAULT_POLE)]
)
def test_equation_12_puts_a_double_closed_loop_pole_at_q(k, b, q):
    gains = pi_gains(k, b, q)
    plant = control.tf([k, -k * b], [1, -1], dt=True)  # k (z - b) / (z - 1), ROMA (8)
    controller = control.tf([gains.K, -gains.K * gains.a], [1, -1], dt=True)  # K (z - a) / (z - 1), ROMA (11)
    poles = control.poles(control.feedback(controller * plant, 1))
    assert np.allclose(poles, [q, q], atol=1e-6), poles


def test_default_design_is_deadbeat_on_a_delayed_static_plant():
    """The loop the executor really closes: y(t) = k u(t - 1). (12)'s defaults make both poles 0."""
    k = 7.3
    gains = pi_gains(k, DEFAULT_ZERO, DEFAULT_POLE)
    assert gains.a == pytest.approx(0, abs=1e-12) and pytest.approx(1 / k) == gains.K
    plant = control.tf([k], [1, 0], dt=True)
    controller = control.tf([gains.K, -gains.K * gains.a], [1, -1], dt=True)
    assert np.allclose(control.poles(control.feedback(controller * plant, 1)), [0, 0], atol=1e-6)


def test_tracking_error_reads_lateness_above_and_speed_below_the_set_point():
    assert tracking_error(80, 100, 0.8) == 0
    assert tracking_error(160, 100, 0.8) == pytest.approx(1.0)  # twice the set point: one set point late
    assert tracking_error(10_000, 100, 0.8) == 4.0  # capped
    assert tracking_error(40, 100, 0.8) == pytest.approx(-0.5)  # twice as fast as needed, capped at -0.5
    assert tracking_error(64, 100, 0.8) == pytest.approx(1 - 80 / 64)
    assert tracking_error(None, 100, 0.8) == -1.0  # idle
    # First-order agreement at the set point.
    assert tracking_error(81, 100, 0.8) == pytest.approx(tracking_error(79.0123, 100, 0.8) * -1, rel=0.02)


def test_plant_gain_is_alpha_sla_over_service_time():
    assert plant_gain(sla_ms=100, setpoint_ratio=0.8, cpu_s_per_request=0.008) == pytest.approx(10.0)


def test_pi_adds_cores_when_late_and_gives_back_when_early():
    pi = PIController(initial_cores=0.5, min_cores=0.1, max_cores=2.0)
    # 8 ms of CPU a request, SLA 100 ms: k = 10, K = 0.1, a = 0.
    up = pi.demand(served(160.0, cpu_s_per_request=0.008), 100.0)
    assert up == pytest.approx(0.5 + 0.1 * 1.0)
    pi.granted(up)
    down = pi.demand(served(40.0, cpu_s_per_request=0.008), 100.0)
    assert down == pytest.approx(up - 0.1 * 0.5)


def test_pi_anti_windup_starts_from_the_granted_cores():
    pi = PIController(initial_cores=1.0, min_cores=0.1, max_cores=4.0)
    wanted = pi.demand(served(400.0, cpu_s_per_request=0.008), 100.0)
    assert wanted == pytest.approx(1.0 + 0.1 * 4.0)
    pi.granted(0.7)  # the supervisor had less to give
    assert pi.demand(served(400.0, cpu_s_per_request=0.008), 100.0) == pytest.approx(0.7 + 0.1 * 4.0)


def test_pi_clamps_to_its_limits():
    pi = PIController(initial_cores=1.9, min_cores=0.1, max_cores=2.0)
    assert pi.demand(served(10_000.0, cpu_s_per_request=0.02), 100.0) == 2.0  # k = 4, K = 0.25: 1.9 + 1.0, clamped
    pi.granted(0.15)
    assert pi.demand(served(None), 100.0) == 0.1


def test_rules_baseline():
    rules = RuleController(initial_cores=1.0, min_cores=0.5, max_cores=3.0)
    assert rules.period_s == 15.0
    assert rules.demand(served(80.0), 100.0) == 2.0  # at 0.8 SLA: one more core
    rules.granted(2.0)
    assert rules.demand(served(50.0), 100.0) == 2.0  # between the thresholds: unchanged
    assert rules.demand(served(20.0), 100.0) == 1.0  # at 0.2 SLA: one fewer
    rules.granted(0.5)
    assert rules.demand(served(None), 100.0) == 0.5  # never under the minimum


def test_supervisor_scales_by_eta_when_demand_exceeds_the_node():
    granted = arbitrate({"a": 2.0, "b": 1.0, "c": 1.0}, node_cores=3.0, reserved_cores=1.0)
    # AC = 3 - 1 = 2, eta = 2 / 4 = 0.5
    assert granted == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.5})


def test_supervisor_grants_demand_as_is_when_eta_is_one():
    assert arbitrate({"a": 1.5, "b": 0.5}, node_cores=2.0) == pytest.approx({"a": 1.5, "b": 0.5})
    assert arbitrate({"a": 1.5, "b": 0.5}, node_cores=2.0, spare_share=1.0) == pytest.approx({"a": 1.5, "b": 0.5})


def test_supervisor_spare_cores_with_gamma_zero_and_one():
    demands = {"a": 0.5, "b": 0.25}
    assert arbitrate(demands, node_cores=3.0, spare_share=0.0) == pytest.approx(demands)
    full = arbitrate(demands, node_cores=3.0, spare_share=1.0)
    assert sum(full.values()) == pytest.approx(3.0)  # all AC handed out ...
    assert full["a"] / full["b"] == pytest.approx(2.0)  # ... in proportion to demand
    half = arbitrate(demands, node_cores=3.0, spare_share=0.5)
    assert sum(half.values()) == pytest.approx(0.75 + 0.5 * (3.0 - 0.75))


def test_node_supervisor_steps_each_controller_on_its_own_period():
    pi = PIController(initial_cores=0.5, min_cores=0.1, max_cores=2.0)
    rules = RuleController(initial_cores=1.0, min_cores=0.5, max_cores=2.0)
    node = NodeSupervisor({"pi": pi, "rules": rules}, {"pi": 0.5, "rules": 1.0}, node_cores=4.0, now=0.0)
    slow = Window()
    for _ in range(10):
        slow.add(100.0)  # at the SLA: over both thresholds
    slas = {"pi": 100.0, "rules": 100.0}
    first = node.step(1.0, {"pi": slow, "rules": slow}, slas)
    assert first["pi"].granted > 0.5  # PI reacted after one period
    assert first["rules"].granted == 1.0  # rules wait for 15 s
    for t in range(2, 15):
        assert node.step(float(t), {}, slas)["rules"].granted == 1.0
    assert node.step(15.0, {}, slas)["rules"].granted == 2.0  # the 15 s window held the slow requests


def test_node_supervisor_arbitrates_and_writes_back_the_grant():
    a = StaticController(3.0)
    b = StaticController(1.0)
    node = NodeSupervisor({"a": a, "b": b}, {"a": 3.0, "b": 1.0}, node_cores=2.0, now=0.0)
    allocation = node.step(1.0, {}, {"a": 10.0, "b": 10.0})
    assert allocation["a"].demanded == 3.0 and allocation["a"].granted == pytest.approx(1.5)
    assert allocation["b"].granted == pytest.approx(0.5)
    assert math.isclose(sum(x.granted for x in allocation.values()), 2.0)


def test_window_mean_and_cpu_per_request():
    window = Window()
    assert window.mean_ms is None and window.cpu_s_per_request is None
    window.add(10.0)
    window.add(30.0)
    window.cpu_s = 0.02
    assert window.mean_ms == 20.0 and window.cpu_s_per_request == pytest.approx(0.01)


def test_gain_from_a_step_test():
    from controllers.identification import StepPoint, gain_from_step

    # alpha SLA = 80 ms: 160 ms at 0.5 core is speed 0.5, 40 ms at 1.0 core is speed 2.
    assert gain_from_step(StepPoint(0.5, 160.0), StepPoint(1.0, 40.0), sla_ms=100, setpoint_ratio=0.8) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        gain_from_step(StepPoint(0.5, 10.0), StepPoint(0.5, 20.0), 100, 0.8)
