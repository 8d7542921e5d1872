"""The control core on a fake clock: starved executors, minimum cores, the first grant, and the
control loop driven through plain callables (no engine, no executor, no psutil)."""

from __future__ import annotations

import ast
import asyncio
import logging
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.pi import DEFAULT_POLE, DEFAULT_ZERO, PIController, plant_gain
from controllers.rules import RuleController
from gateway.config import (
    ControlConfig,
    CpuExecutorConfig,
    GatewayConfig,
    ModelConfig,
    NodeConfig,
    PlantConfig,
    PolicyConfig,
    ServerConfig,
)
from gateway.control import ControlLoop
from gateway.protocol import InvalidRequest
from supervisor.arbitration import arbitrate
from supervisor.node import NodeSupervisor, Window

ROOT = Path(__file__).resolve().parent.parent

# The PP-OCR detector of the bug report: SLA 1 s, floor 0.1 core, about 0.3 core-second per
# 640x640 image, so at 0.1 core one image takes 3 s and four clients starve it.
SLA_MS = 1000.0
FLOOR = 0.1
CPU_S_PER_IMAGE = 0.3


def starved(oldest_wait_s: float, *, waiting: int = 4, cpu_s: float = 0.1) -> Window:
    """A period in which nothing completed while ``waiting`` requests were queued or running."""
    return Window(cpu_s=cpu_s, waiting=waiting, oldest_wait_ms=oldest_wait_s * 1000)


def detector(**kwargs) -> PIController:
    return PIController(initial_cores=FLOOR, min_cores=FLOOR, max_cores=4.0, **kwargs)


# -- a starved executor is not idle (bug 2) ----------------------------------------------------


def test_window_reads_the_age_of_waiting_work_as_a_response_time():
    assert Window().response_ms is None  # idle: nothing completed, nothing waits
    assert starved(1.2).response_ms == 1200.0  # nothing completed, but a request waited 1.2 s
    busy = Window(count=2, total_ms=200.0, waiting=3, oldest_wait_ms=900.0)
    assert busy.mean_ms == 100.0 and busy.response_ms == 900.0  # the oldest waits longer than the mean
    assert Window(count=2, total_ms=200.0, waiting=1, oldest_wait_ms=5.0).response_ms == 100.0
    # A window over several periods keeps the sums and the state at its end.
    window = Window(count=1, total_ms=50.0, waiting=4, oldest_wait_ms=700.0)
    window.merge(Window(count=1, total_ms=150.0))
    assert (window.count, window.mean_ms, window.waiting, window.response_ms) == (2, 100.0, 0, 100.0)


def test_pi_raises_a_starved_executor_off_its_floor_within_two_periods():
    """PP-OCR at its 0.1-core floor, four clients, no completion for seconds: the old reading
    (no completion = idle, e = -1) held it at the floor and the first answers took 5.1 s."""
    pi = detector(k=plant_gain(SLA_MS, 0.8, CPU_S_PER_IMAGE))  # k = 2.67, K = 0.375, a = 0
    first = pi.demand(starved(1.2), SLA_MS)
    assert first == pytest.approx(FLOOR + 0.375 * (1200 / 800 - 1))  # e = 0.5: 0.29 core
    pi.granted(first)
    second = pi.demand(starved(2.2), SLA_MS)
    assert second == pytest.approx(first + 0.375 * (2200 / 800 - 1))  # e = 1.75: 0.94 core
    assert second >= 0.5
    pi.granted(second)
    # Nothing completed and nothing waits: idle, cores are given back at the full pace (e = -1).
    assert pi.demand(Window(), SLA_MS) == pytest.approx(second - 0.375)


def test_supervisor_raises_a_starved_model_and_still_lowers_an_idle_one():
    det = detector()  # k unknown at first: identified from the CPU time per completed image
    other = PIController(initial_cores=1.0, min_cores=0.1, max_cores=4.0)
    node = NodeSupervisor({"det": det, "other": other}, {"det": FLOOR, "other": 1.0}, node_cores=4.0)
    slas = {"det": SLA_MS, "other": 100.0}
    # One image served at the set point (0.8 s): no change, but k = alpha SLA / s is measured.
    at_setpoint = Window(count=1, total_ms=800.0, cpu_s=CPU_S_PER_IMAGE)
    assert node.step(1.0, {"det": at_setpoint, "other": Window()}, slas)["det"].granted == pytest.approx(FLOOR)
    # The burst: four images queued, none completes.
    first = node.step(2.0, {"det": starved(1.2), "other": Window()}, slas)
    assert first["det"].granted > FLOOR
    second = node.step(3.0, {"det": starved(2.2), "other": Window()}, slas)
    assert second["det"].granted >= 0.5
    assert second["other"].granted < first["other"].granted < 1.0  # idle: given back every period
    # The queue drained and nothing waits any more: the detector gives cores back too.
    assert node.step(4.0, {"det": Window(), "other": Window()}, slas)["det"].granted < second["det"].granted


def test_rules_baseline_scales_a_starved_executor_up():
    rules = RuleController(initial_cores=1.0, min_cores=0.5, max_cores=3.0)
    assert rules.demand(starved(0.9), SLA_MS) == 2.0  # waited 0.9 SLA: one more core
    assert rules.demand(Window(), SLA_MS) == 0.5  # idle: one fewer


# -- minimum cores and the first grant (bug 3) -------------------------------------------------


def test_arbitrate_keeps_every_model_at_its_minimum():
    # eta = 2 / 3.5 would give "b" 0.29 core, under its 0.5 minimum.
    granted = arbitrate({"a": 3.0, "b": 0.5}, node_cores=2.0, min_cores={"a": 0.1, "b": 0.5})
    assert granted == pytest.approx({"a": 1.5, "b": 0.5})
    # Demand under the minimum: the minimum never grants more than was asked.
    assert arbitrate({"a": 3.0, "b": 0.2}, node_cores=2.0, min_cores={"b": 0.5})["b"] <= 0.2


def test_arbitrate_is_the_papers_rule_when_no_minimum_binds():
    demands = {"a": 2.0, "b": 1.0, "c": 1.0}
    mins = {"a": 0.1, "b": 0.1, "c": 0.1}
    assert arbitrate(demands, node_cores=3.0, reserved_cores=1.0, min_cores=mins) == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.5})
    spare = arbitrate({"a": 0.5, "b": 0.25}, node_cores=3.0, spare_share=1.0, min_cores={"a": 0.3, "b": 0.3})
    assert spare == pytest.approx({"a": 2.0, "b": 1.0})


def test_arbitrate_scales_the_minimums_when_even_they_do_not_fit():
    granted = arbitrate({"a": 2.0, "b": 3.0}, node_cores=2.0, min_cores={"a": 1.5, "b": 2.5})
    assert granted == pytest.approx({"a": 0.75, "b": 1.25})


@given(
    st.dictionaries(
        st.sampled_from("abcdef"),
        st.tuples(st.floats(0.0, 8.0), st.floats(0.0, 2.0)),
        min_size=1,
    ),
    st.floats(0.5, 16.0),
)
def test_arbitrate_never_exceeds_the_node_nor_drops_a_model_under_its_minimum(models, node_cores):
    demands = {name: u for name, (u, _) in models.items()}
    mins = {name: m for name, (_, m) in models.items()}
    granted = arbitrate(demands, node_cores, min_cores=mins)
    floors = {name: min(demands[name], mins[name]) for name in demands}
    if sum(demands.values()) > node_cores:
        assert sum(granted.values()) <= node_cores + 1e-9
    else:
        assert granted == pytest.approx(demands)
    if sum(floors.values()) <= node_cores:
        assert all(granted[name] >= floors[name] - 1e-9 for name in demands)


def test_supervisor_keeps_a_model_at_its_minimum_under_contention():
    big = PIController(initial_cores=3.5, min_cores=0.1, max_cores=4.0)
    small = PIController(initial_cores=0.5, min_cores=0.5, max_cores=4.0)
    node = NodeSupervisor(
        {"big": big, "small": small}, {"big": 3.5, "small": 0.5}, node_cores=2.0, min_cores={"big": 0.1, "small": 0.5}
    )
    for allocations in (
        node.initial,
        node.step(1.0, {"big": starved(3.0), "small": starved(3.0)}, {"big": SLA_MS, "small": SLA_MS}),
    ):
        assert allocations["small"].granted >= 0.5
        assert allocations["big"].granted >= 0.1
        assert sum(a.granted for a in allocations.values()) <= 2.0 + 1e-9


def test_controllers_start_from_the_cores_they_were_really_granted():
    a = PIController(initial_cores=1.5, min_cores=0.1, max_cores=4.0)
    b = PIController(initial_cores=1.5, min_cores=0.1, max_cores=4.0)
    node = NodeSupervisor({"a": a, "b": b}, {"a": 1.5, "b": 1.5}, node_cores=2.0)
    assert {name: x.granted for name, x in node.initial.items()} == pytest.approx({"a": 1.0, "b": 1.0})
    # At the set point the error is 0: the first step keeps the state, 1.0 (what the
    # executors were given), not the 1.5 the controllers asked for.
    at_setpoint = Window(count=1, total_ms=0.8 * SLA_MS)
    assert a.demand(at_setpoint, SLA_MS) == pytest.approx(1.0)
    assert b.demand(at_setpoint, SLA_MS) == pytest.approx(1.0)


# -- the control loop through callables (no engine) --------------------------------------------


def model(name: str, *, cores: float, min_cores: float = 0.1, sla_ms: float = SLA_MS, gain: float = 10.0) -> ModelConfig:
    return ModelConfig(
        name=name,
        path=Path(f"{name}.onnx"),
        sla_ms=sla_ms,
        max_batch_size=1,
        cpu=CpuExecutorConfig(cores=cores, threads=1, min_cores=min_cores, max_cores=4.0),
        plant=PlantConfig(gain=gain, zero=DEFAULT_ZERO, pole=DEFAULT_POLE),
    )


def gateway_config(*models: ModelConfig, node_cores: float = 2.0, policy: str = "pi", period_s: float = 1.0) -> GatewayConfig:
    return GatewayConfig(
        source=Path("test.toml"),
        server=ServerConfig(),
        node=NodeConfig(cpu_cores=node_cores),
        policy=PolicyConfig(),
        control=ControlConfig(policy=policy, period_s=period_s),
        models={m.name: m for m in models},
    )


class Recorder:
    """The three callables an engine gives the control loop, recording every call."""

    def __init__(self, windows: dict[str, Window] | None = None):
        self.windows = windows or {}
        self.measured = 0
        self.cores: dict[str, float] = {}
        self.periods: list[tuple[float, dict, dict]] = []

    def measure(self) -> dict[str, Window]:
        self.measured += 1
        return dict(self.windows)

    def set_cores(self, name: str, cores: float) -> None:
        self.cores[name] = cores

    def on_period(self, now, allocations, windows) -> None:
        self.periods.append((now, dict(allocations), dict(windows)))


def test_control_loop_source_knows_no_engine_and_no_psutil():
    tree = ast.parse((ROOT / "gateway" / "control.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "gateway.engine" not in imported and "psutil" not in imported


def test_control_loop_measures_decides_applies_and_records_once_a_period():
    config = gateway_config(
        model("det", cores=FLOOR, gain=plant_gain(SLA_MS, 0.8, CPU_S_PER_IMAGE)), model("mlp", cores=1.0, sla_ms=100.0)
    )
    io = Recorder({"det": starved(1.2), "mlp": Window(count=10, total_ms=400.0)})
    clock = iter([0.0])
    loop = ControlLoop(config, measure=io.measure, set_cores=io.set_cores, on_period=io.on_period, clock=lambda: next(clock))
    assert loop.initial_cores == pytest.approx({"det": FLOOR, "mlp": 1.0})
    allocations = loop.tick(1.0)
    assert io.measured == 1 and len(io.periods) == 1
    now, recorded, windows = io.periods[0]
    assert now == 1.0 and recorded == allocations and windows["det"].waiting == 4
    assert io.cores == {name: a.granted for name, a in allocations.items()}
    assert allocations["det"].granted > FLOOR  # starved: more cores at the first period
    assert allocations["mlp"].granted == pytest.approx(0.95)  # 40 ms against 80 ms: e = -0.5, K = 0.1


def test_control_loop_pins_and_hands_back_from_the_last_grant():
    config = gateway_config(model("a", cores=1.0), model("b", cores=0.5))
    io = Recorder()
    loop = ControlLoop(config, measure=io.measure, set_cores=io.set_cores, clock=lambda: 0.0)
    loop.pin("a", 0.4)
    assert loop.pinned == {"a": 0.4} and io.cores == pytest.approx({"a": 0.4, "b": 0.5})  # applied at once
    loop.pin("a", None)  # back to the PI controller, starting from the 0.4 it was last granted
    assert loop.pinned == {"a": None} and io.cores["a"] == pytest.approx(0.4)
    assert loop.supervisor.controllers["a"].demand(Window(count=1, total_ms=800.0), SLA_MS) == pytest.approx(0.4)


def test_control_loop_fits_initial_cores_to_the_node_with_each_models_minimum():
    config = gateway_config(model("big", cores=3.5), model("small", cores=0.5, min_cores=0.5))
    loop = ControlLoop(config, measure=dict, set_cores=lambda name, cores: None, clock=lambda: 0.0)
    assert loop.initial_cores == pytest.approx({"big": 1.5, "small": 0.5})


def test_cores_set_aside_for_a_loading_model_leave_every_served_model_its_minimum():
    """A model of 2 cores loaded on a node of 2: all of them were set aside, and a served model
    with min_cores 0.5 was granted 0 cores while the new one started and was profiled."""
    config = gateway_config(model("served", cores=1.0, min_cores=0.5), policy="fixed")
    io = Recorder()
    loop = ControlLoop(config, measure=io.measure, set_cores=io.set_cores, clock=lambda: 0.0)
    aside = loop.set_aside(2.0, min_cores=0.1)
    assert aside == pytest.approx(1.5) and io.cores["served"] == pytest.approx(0.5)
    loop.give_back(aside)
    # A new model whose own minimum the others' minimums leave no room for is refused, and nothing is set aside.
    with pytest.raises(InvalidRequest, match="leave 1.5, under this model's min_cores of 1.6"):
        loop.set_aside(2.0, min_cores=1.6)
    assert loop.supervisor.reserved_cores == 0.0 and io.cores["served"] == pytest.approx(1.0)


def test_grants_applied_one_by_one_never_add_up_past_the_node():
    """A model loaded beside one pinned at all of a node of 2 cores: it started on the 1.5 cores
    set aside for it, and joining refitted both (1.14 and 0.86). Applied in the models' order,
    the pinned model was raised to 1.14 while the new one still held 1.5: 2.64 cores of quota."""
    config = gateway_config(model("served", cores=0.5), policy="fixed")
    held: dict[str, float] = {}
    most = 0.0

    def set_cores(name: str, cores: float) -> None:
        nonlocal most
        held[name] = cores
        most = max(most, sum(held.values()))

    loop = ControlLoop(config, measure=dict, set_cores=set_cores, clock=lambda: 0.0)
    loop.pin("served", 2.0)
    aside = loop.set_aside(1.5, min_cores=0.1)
    held["loaded"] = aside  # its executor starts on the cores set aside
    loaded = model("loaded", cores=1.5)
    config.models["loaded"] = loaded
    loop.add_model(loaded, set_aside=aside)
    assert held == pytest.approx({"served": 2.0 * 2 / 3.5, "loaded": 1.5 * 2 / 3.5})
    assert most <= 2.0 + 1e-9, most


def test_rr_max_splits_the_node_evenly_among_the_models_served_after_loads_and_unloads():
    """``max`` (ROMA's RR+max) gives each model the node split evenly. Its shares were fixed for the
    models of the start: after an unload of one of three, the two left held 0.67 core each and
    0.67 went to no one; after a load the new model had less than the others."""
    config = gateway_config(*(model(name, cores=0.5) for name in ("a", "b", "c")), policy="max")
    io = Recorder()
    loop = ControlLoop(config, measure=dict, set_cores=io.set_cores, clock=lambda: 0.0)
    assert loop.initial_cores == pytest.approx({"a": 2 / 3, "b": 2 / 3, "c": 2 / 3})
    loop.remove_model("c")
    del config.models["c"]
    assert {name: io.cores[name] for name in "ab"} == pytest.approx({"a": 1.0, "b": 1.0})
    for name in ("d", "e"):
        aside = loop.set_aside(0.5, min_cores=0.1)
        config.models[name] = model(name, cores=0.5)
        loop.add_model(config.models[name], set_aside=aside)
    assert {name: io.cores[name] for name in "abde"} == pytest.approx(dict.fromkeys("abde", 0.5))
    loop.pin("a", 0.2)  # an operator's pin stays when the others are split again
    loop.remove_model("e")
    del config.models["e"]
    assert {name: io.cores[name] for name in "abd"} == pytest.approx({"a": 0.2, "b": 2 / 3, "d": 2 / 3})


def test_control_loop_says_when_the_minimums_do_not_fit(caplog):
    config = gateway_config(model("a", cores=1.5, min_cores=1.5), model("b", cores=1.5, min_cores=1.5), policy="min")
    with caplog.at_level(logging.WARNING, logger="gateway"):
        loop = ControlLoop(config, measure=dict, set_cores=lambda name, cores: None, clock=lambda: 0.0)
    assert "exceed" in caplog.text
    assert loop.initial_cores == pytest.approx({"a": 1.0, "b": 1.0})


async def test_control_loop_schedules_its_periods_on_its_own_clock():
    """A clock at half the pace of real time: periods of 0.1 clock-second come every 0.2 s. A
    loop timed by the event loop's own time would tick every 0.1 s, 0.05 clock-second apart."""

    def clock() -> float:
        return time.perf_counter() / 2

    io = Recorder()
    config = gateway_config(model("a", cores=1.0), period_s=0.1)
    loop = ControlLoop(config, measure=io.measure, set_cores=io.set_cores, on_period=io.on_period, clock=clock)
    start = clock()
    loop.start()
    await asyncio.sleep(0.7)
    await loop.stop()
    ticks = [now for now, _, _ in io.periods]
    assert 2 <= len(ticks) <= 4  # 3 expected (0.2, 0.4, 0.6 s), 7 on the event loop's time
    # Never early by the clock: the k-th period ends k x 0.1 clock-second after the start or
    # later (a late wake-up on a busy machine may bring the next one closer, never earlier).
    assert all(tick - start >= (k + 1) * 0.1 - 1e-6 for k, tick in enumerate(ticks)), [t - start for t in ticks]
