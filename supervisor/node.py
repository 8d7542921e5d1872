"""The node supervisor's control step (ROMA Section 3, Algorithm 2), pure and clock-driven.

Every tick (the control period) it is handed what each model's executor served since the last
tick; each controller is asked for its demand when its own period has passed (1 s for ROMA's
PI controller, 15 s for the rules baseline), over everything served since it was last asked.
The demands are then fitted to the node (``arbitrate``) and every controller is told what it
was granted, which is the anti-windup of its next step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controllers.base import CoreController
from supervisor.arbitration import arbitrate


@dataclass
class Window:
    """Response times of the requests a model served over a stretch of time."""

    count: int = 0
    total_ms: float = 0.0
    cpu_s: float = 0.0  # CPU time the executor used meanwhile (0 when unmeasured)

    def add(self, rt_ms: float) -> None:
        self.count += 1
        self.total_ms += rt_ms

    def merge(self, other: Window) -> None:
        self.count += other.count
        self.total_ms += other.total_ms
        self.cpu_s += other.cpu_s

    @property
    def cpu_s_per_request(self) -> float | None:
        return self.cpu_s / self.count if self.count and self.cpu_s > 0 else None

    @property
    def mean_ms(self) -> float | None:
        return self.total_ms / self.count if self.count else None


@dataclass(frozen=True)
class Allocation:
    demanded: float
    granted: float


class NodeSupervisor:
    def __init__(
        self,
        controllers: Mapping[str, CoreController],
        initial_cores: Mapping[str, float],
        *,
        node_cores: float,
        reserved_cores: float = 0.0,
        spare_share: float = 0.0,
        now: float = 0.0,
        tick_s: float = 1.0,
    ):
        self.controllers = dict(controllers)
        self.node_cores, self.reserved_cores, self.spare_share = node_cores, reserved_cores, spare_share
        self.tick_s = tick_s
        self._demands = dict(initial_cores)
        self._pending = {name: Window() for name in controllers}
        self._due = {name: now + c.period_s for name, c in controllers.items()}

    def replace(self, name: str, controller: CoreController, demand: float, now: float) -> None:
        """Put another controller in charge of a model (an operator's pin, or its release)."""
        self.controllers[name] = controller
        self._demands[name] = demand
        self._pending[name] = Window()
        self._due[name] = now + controller.period_s

    def step(self, now: float, served: Mapping[str, Window], sla_ms: Mapping[str, float]) -> dict[str, Allocation]:
        for name, controller in self.controllers.items():
            window = self._pending[name]
            window.merge(served.get(name, Window()))
            # Half a tick of tolerance: timers fire a little early or late, and a period must
            # never be skipped (nor taken twice) for that.
            if now >= self._due[name] - self.tick_s / 2:
                self._demands[name] = controller.demand(window.mean_ms, sla_ms[name], window.cpu_s_per_request)
                self._pending[name] = Window()
                self._due[name] = now + controller.period_s
        return self.grant()

    def grant(self) -> dict[str, Allocation]:
        """Fit the current demands to the node and tell every controller what it was granted."""
        granted = arbitrate(self._demands, self.node_cores, self.reserved_cores, self.spare_share)
        for name, controller in self.controllers.items():
            controller.granted(granted[name])
        return {name: Allocation(self._demands[name], granted[name]) for name in self.controllers}
