"""The control plane's asyncio side: the per-period timer, measurement windows and actuation.

The decisions live in controllers/ and supervisor/ (pure); this module builds them from the
config, feeds them each period's measurements and hands the granted cores to the executors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import psutil

from controllers.base import CoreController
from controllers.pi import PIController
from controllers.rules import RuleController
from controllers.static import StaticController
from gateway.config import ControlConfig, ModelConfig
from supervisor.arbitration import arbitrate
from supervisor.node import NodeSupervisor, Window

if TYPE_CHECKING:
    from gateway.engine import Engine

log = logging.getLogger("gateway")


def make_controller(policy: str, model: ModelConfig, control: ControlConfig, node_cores: float, models: int) -> CoreController:
    cpu = model.cpu
    if policy == "pi":
        plant = model.plant
        return PIController(
            initial_cores=cpu.cores,
            min_cores=cpu.min_cores,
            max_cores=cpu.max_cores,
            k=plant.gain,
            b=plant.zero,
            q=plant.pole,
            setpoint_ratio=control.setpoint_ratio,
            period_s=control.period_s,
        )
    if policy == "rules":
        return RuleController(initial_cores=cpu.cores, min_cores=cpu.min_cores, max_cores=cpu.max_cores)
    if policy == "max":
        return StaticController((node_cores - control.reserved_cores) / models, control.period_s)
    if policy == "min":
        return StaticController(cpu.min_cores, control.period_s)
    return StaticController(cpu.cores, control.period_s)


class ControlLoop:
    """Every control period: close each model's window, step the supervisor, actuate."""

    def __init__(self, engine: Engine):
        self.engine = engine
        config = engine.config
        control = config.control
        controllers = {
            name: make_controller(control.policy, model, control, config.node.cpu_cores, len(config.models))
            for name, model in config.models.items()
        }
        self.period_s = control.period_s
        initial = {
            name: c.cores if isinstance(c, StaticController) else config.models[name].cpu.cores for name, c in controllers.items()
        }
        #: What each executor starts with: the initial demands, fitted to the node.
        self.initial_cores = arbitrate(initial, config.node.cpu_cores, control.reserved_cores, control.spare_share)
        self.supervisor = NodeSupervisor(
            controllers,
            initial,
            node_cores=config.node.cpu_cores,
            reserved_cores=control.reserved_cores,
            spare_share=control.spare_share,
            now=engine.now,
            tick_s=control.period_s,
        )
        self._task: asyncio.Task[None] | None = None
        self._cpu_seen: dict[str, tuple[int | None, float]] = {}
        self.pinned: dict[str, float | None] = {}

    def pin(self, name: str, cores: float | None) -> None:
        """Hold a model at ``cores`` from now on (None: hand it back to the configured policy).

        The supervisor still fits the pinned demand to the node with the others; the granted
        cores are applied at once, not at the next period.
        """
        engine = self.engine
        config, control = engine.config, engine.config.control
        model = config.models[name]
        if cores is None:
            controller = make_controller(control.policy, model, control, config.node.cpu_cores, len(config.models))
            demand = sum(e.cores for e in engine.models[name].executors)
        else:
            controller, demand = StaticController(cores, control.period_s), cores
        self.pinned[name] = cores
        self.supervisor.replace(name, controller, demand, engine.now)
        for other, allocation in self.supervisor.grant().items():
            engine.set_cores(engine.models[other], allocation.granted)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + self.period_s
        while True:
            # Ticks on a fixed grid: a slow tick does not push every later one back.
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            try:
                self.tick()
            except Exception:
                log.exception("control step failed; the cores stay as they are")
            next_tick += self.period_s
            if next_tick < loop.time():
                next_tick = loop.time() + self.period_s

    def _cpu_seconds(self, pid: int | None) -> float | None:
        """CPU time used so far by the executor process (user + system)."""
        if pid is None:
            return None
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return None
        return times.user + times.system

    def tick(self) -> None:
        engine = self.engine
        now = engine.now
        served: dict[str, Window] = {}
        for name, runtime in engine.models.items():
            served[name], runtime.window = runtime.window, Window()
            used = 0.0
            for executor in runtime.executors:
                total = self._cpu_seconds(executor.pid)
                previous = self._cpu_seen.get(executor.id)
                if total is not None and previous is not None and previous[0] == executor.pid:
                    used += total - previous[1]
                if total is not None:
                    self._cpu_seen[executor.id] = (executor.pid, total)
            served[name].cpu_s = used
        sla = {name: runtime.sla_ms for name, runtime in engine.models.items()}
        allocations = self.supervisor.step(now, served, sla)
        for name, runtime in engine.models.items():
            allocation = allocations[name]
            engine.set_cores(runtime, allocation.granted)
            runtime.close_window(now, served[name], allocation.demanded, allocation.granted)
