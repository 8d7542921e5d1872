"""The control plane's asyncio side: the per-period timer around the pure control decisions.

The decisions live in controllers/ (a demand per model) and supervisor/ (ROMA Algorithm 2: the
demands fitted to the node); this module builds them from the config, and every period asks
its caller for the measurements and hands the granted cores back. It knows nothing of the
engine or the executors: it is given three callables,

- ``measure()``: per model, what its CPU executor(s) did since the last call (a ``Window``:
  completed requests, CPU time used, and the requests still queued or running at the end);
- ``set_cores(model, cores)``: apply granted cores to the model's executor(s);
- ``on_period(now, allocations, windows)``: record the period (history, violations, metrics);

and a clock (time.perf_counter by default, never the event loop's: uvloop's loop.time() has a
1 ms grain and does not advance between iterations, ../shared/DESIGN.md "Facts checked").

Only the models with a CPU executor are controlled: a GPU-only model (``cpu_executor = false``)
has no cores to grant, takes no share of the node's and is left out of every period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping

from controllers.base import CoreController
from controllers.feedforward import FeedForwardController
from controllers.pi import PIController
from controllers.rules import RuleController
from controllers.static import StaticController
from gateway.config import ControlConfig, CpuExecutorConfig, GatewayConfig, ModelConfig
from gateway.protocol import InvalidRequest
from supervisor.node import Allocation, NodeSupervisor, Window

log = logging.getLogger("gateway")

Measure = Callable[[], Mapping[str, Window]]
SetCores = Callable[[str, float], None]
OnPeriod = Callable[[float, Mapping[str, Allocation], Mapping[str, Window]], None]


def _cpu(model: ModelConfig) -> CpuExecutorConfig:
    if model.cpu is None:
        raise ValueError(f"model {model.name} has no CPU executor (cpu_executor = false): no cores to control")
    return model.cpu


def make_controller(policy: str, model: ModelConfig, control: ControlConfig, node_cores: float, models: int) -> CoreController:
    """The controller of ``model``'s CPU executor; ``models``: how many models have one."""
    cpu = _cpu(model)
    if policy in ("pi", "feedforward"):
        # Both regulate on ROMA's PI (equations 11-12) with the model's plant; ours also predicts.
        plant = model.plant
        common = dict(
            initial_cores=cpu.cores,
            min_cores=cpu.min_cores,
            max_cores=cpu.max_cores,
            k=plant.gain,
            b=plant.zero,
            q=plant.pole,
            period_s=control.period_s,
        )
        if policy == "pi":
            return PIController(**common, setpoint_ratio=control.setpoint_ratio)
        return FeedForwardController(**common, measure=model.measure, setpoint_ratio=control.feedforward_setpoint_ratio)
    if policy == "rules":
        return RuleController(initial_cores=cpu.cores, min_cores=cpu.min_cores, max_cores=cpu.max_cores)
    if policy == "max":
        return StaticController((node_cores - control.reserved_cores) / models, control.period_s)
    if policy == "min":
        return StaticController(cpu.min_cores, control.period_s)
    return StaticController(cpu.cores, control.period_s)


def floor_cores(controller: CoreController, model: ModelConfig) -> float:
    """The model's minimum in the arbitration: its min_cores, or a static controller's own
    value when that is lower (the RR+min/max baselines, an operator's pin)."""
    if isinstance(controller, StaticController):
        return min(controller.cores, _cpu(model).min_cores)
    return _cpu(model).min_cores


def _no_record(now: float, allocations: Mapping[str, Allocation], windows: Mapping[str, Window]) -> None:
    pass


class ControlLoop:
    """Every control period: measure each model, step the supervisor, apply the grant, record."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        measure: Measure,
        set_cores: SetCores,
        on_period: OnPeriod = _no_record,
        sla_ms: Callable[[str], float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        """``sla_ms(model)`` is the model's current SLA (the admin API changes it at run time);
        by default the configured one."""
        self.config = config
        self.measure, self.set_cores, self.on_period, self.clock = measure, set_cores, on_period, clock
        self.sla_ms = sla_ms if sla_ms is not None else (lambda name: config.models[name].sla_ms)
        control = config.control
        self.period_s = control.period_s
        #: The models it controls: those with a CPU executor.
        self.models = {name: model for name, model in config.models.items() if model.cpu is not None}
        controllers = {name: self._controller(model) for name, model in self.models.items()}
        initial = {
            name: c.cores if isinstance(c, StaticController) else _cpu(self.models[name]).cores for name, c in controllers.items()
        }
        min_cores = {name: floor_cores(c, config.models[name]) for name, c in controllers.items()}
        available = config.node.cpu_cores - control.reserved_cores
        if sum(min_cores.values()) > available + 1e-9:
            log.warning(
                "the models' minimum cores (%g in all) exceed the %g cores available to CPU executors; "
                "under contention every model gets less than its minimum",
                sum(min_cores.values()),
                available,
            )
        started = clock()
        self.supervisor = NodeSupervisor(
            controllers,
            initial,
            node_cores=config.node.cpu_cores,
            reserved_cores=control.reserved_cores,
            spare_share=control.spare_share,
            min_cores=min_cores,
            now=started,
            tick_s=control.period_s,
            grant_rule=control.grant,
            setpoint_ratio=control.setpoint_ratio,
        )
        #: What each executor starts with: the initial demands fitted to the node (the
        #: controllers were told the same values: their first step starts from them).
        self.initial_cores = {name: allocation.granted for name, allocation in self.supervisor.initial.items()}
        # The last cores granted to each model: where a model handed back to its policy starts.
        self._granted = dict(self.initial_cores)
        self.pinned: dict[str, float | None] = {}
        self._last_tick = started
        self._reacted: dict[str, float] = {}  # when each model last raised its demand between periods
        self._task: asyncio.Task[None] | None = None

    def _controller(self, model: ModelConfig) -> CoreController:
        control = self.config.control
        return make_controller(control.policy, model, control, self.config.node.cpu_cores, len(self.models))

    def pin(self, name: str, cores: float | None) -> None:
        """Hold a model at ``cores`` from now on (None: hand it back to the configured policy,
        starting from the cores it was last granted).

        The supervisor still fits the pinned demand to the node with the others; the granted
        cores are applied at once, not at the next period. A model without a CPU executor has no
        cores to pin: that is the admin's mistake (InvalidRequest, a 400 of the admin API).
        """
        model = self.config.models[name]
        if name not in self.models:
            raise InvalidRequest(f"model '{name}' has no CPU executor (cpu_executor = false): it has no cores to pin")
        if cores is None:
            controller, demand = self._controller(model), self._granted[name]
        else:
            controller, demand = StaticController(cores, self.config.control.period_s), cores
        self.pinned[name] = cores
        self.supervisor.replace(name, controller, demand, self.clock(), min_cores=floor_cores(controller, model))
        self._apply(self.supervisor.grant())

    def set_aside(self, cores: float, min_cores: float, reloading: bool = False) -> float:
        """Keep ``cores`` out of the arbitration, the other models' grants fitted at once: a model
        being loaded starts and is profiled on them before it joins (``add_model``). Started on its
        configured cores beside grants that filled the node, it took the node past its cores until
        then. At most what the other models' minimums leave (all of a model's 2 cores set aside on
        a node of 2 held a serving model at 0 cores while it loaded); where that is under the new
        model's own ``min_cores``, the minimums cannot all be held and the load is refused (400).
        A reload (``reloading``) starts its executor beside the one it replaces, whose minimum is
        held meanwhile. The cores set aside."""
        supervisor = self.supervisor
        room = supervisor.node_cores - supervisor.reserved_cores - supervisor.floors()
        if room < min_cores - 1e-9:  # a float's rounding is no shortfall
            beside = "; a reload starts beside the model it replaces: unload that first" if reloading else ""
            raise InvalidRequest(
                f"the node's cores ({supervisor.node_cores:g}, node.cpu_cores) hold the served models' minimums "
                f"and leave {max(0.0, room):.3g}, under this model's min_cores of {min_cores:g}{beside}"
            )
        cores = max(min_cores, min(cores, room))
        supervisor.reserved_cores += cores
        self._apply(supervisor.grant())
        return cores

    def give_back(self, cores: float) -> None:
        """The cores of ``set_aside``, back to the arbitration (the load failed)."""
        self.supervisor.reserved_cores -= cores
        self._apply(self.supervisor.grant())

    def add_model(self, model: ModelConfig, set_aside: float = 0.0) -> None:
        """A model loaded at run time: its controller joins the node's arbitration at once (the
        caller has put it in the config's models), with the cores set aside for it."""
        self.supervisor.reserved_cores -= set_aside
        if model.cpu is not None:
            self._granted[model.name] = set_aside  # what its executor started on (lowered first if less)
        if model.cpu is None:
            self._apply(self.supervisor.grant())
            return
        self.models[model.name] = model
        controller = self._controller(model)
        self.supervisor.replace(model.name, controller, model.cpu.cores, self.clock(), min_cores=floor_cores(controller, model))
        self.supervisor.deficits[model.name] = 0.0
        self._split_again()
        self._apply(self.supervisor.grant())

    def remove_model(self, name: str) -> None:
        """A model unloaded at run time: its cores go back to the others at once."""
        if self.models.pop(name, None) is None:
            return
        self.supervisor.remove(name)
        for table in (self.pinned, self._granted, self._reacted):
            table.pop(name, None)
        self._split_again()
        self._apply(self.supervisor.grant())

    def _split_again(self) -> None:
        """Under ``max`` (RR+max: the node split evenly), each model's share for the models served
        now. Its controllers were built for the models served at start: after an unload a third
        of the node went to no one, after a load the new model got less than the others."""
        if self.config.control.policy != "max":
            return
        now = self.clock()
        for name, model in self.models.items():
            if self.pinned.get(name) is None:  # an operator's pin stays
                controller = self._controller(model)
                self.supervisor.replace(name, controller, controller.cores, now, min_cores=floor_cores(controller, model))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        next_tick = self.clock() + self.period_s
        while True:
            # Ticks on a fixed grid of the clock: a slow tick does not push every later one back.
            # The event loop's timers may fire early by their grain (1 ms on uvloop): sleep again.
            while (delay := next_tick - self.clock()) > 0:
                await asyncio.sleep(delay)
            try:
                self.tick()
            except Exception:
                log.exception("control step failed; the cores stay as they are")
            next_tick += self.period_s
            now = self.clock()
            if next_tick < now:
                next_tick = now + self.period_s

    def tick(self, now: float | None = None) -> dict[str, Allocation]:
        """One control period: measure, decide (controllers and ROMA Algorithm 2), apply, record."""
        now = self.clock() if now is None else now
        self._last_tick = now
        windows = dict(self.measure())
        sla = {name: self.sla_ms(name) for name in self.models}
        allocations = self.supervisor.step(now, windows, sla)
        self._apply(allocations)
        self.on_period(now, allocations, windows)
        return allocations

    def react(self, name: str, so_far: Callable[[], Window], now: float | None = None) -> bool:
        """Work reached ``name``'s CPU executor between periods (the GPUs spilled to it): let its
        controller raise its demand at once if it predicts one (``FeedForwardController.react``;
        ROMA's controllers only act on the period). ``so_far()`` is what the executor did since the
        last period, with the work waiting now (asked for only when the controller is asked).
        At most once per tenth of a period per model.
        True when the cores were raised."""
        now = self.clock() if now is None else now
        controller = self.supervisor.controllers.get(name)
        if not isinstance(controller, FeedForwardController) or now - self._reacted.get(name, -math.inf) < self.period_s / 10:
            return False
        self._reacted[name] = now
        demand = controller.react(so_far(), self.sla_ms(name), now - self._last_tick)
        if demand is None:
            return False
        self._apply(self.supervisor.raise_demand(name, demand))
        return True

    def _apply(self, allocations: Mapping[str, Allocation]) -> None:
        # Lowered grants first: applied in the models' order, a raised grant set before another
        # model's lowered one took the node past its cores in between (2.64 cores of quota on a
        # node of 2 while a loaded model's set-aside cores were refitted with a pinned model's).
        def change(item: tuple[str, Allocation]) -> float:
            name, allocation = item
            return allocation.granted - self._granted.get(name, 0.0)

        for name, allocation in sorted(allocations.items(), key=change):
            self._granted[name] = allocation.granted
            self.set_cores(name, allocation.granted)
