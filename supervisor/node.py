"""The node supervisor's control step (ROMA Section 3, Algorithm 2), pure and clock-driven.

Every tick (the control period) it is handed what each model's executor did since the last
tick (a ``Window``: completed requests, CPU time, the work still waiting); each controller is
asked for its demand when its own period has passed (1 s for ROMA's PI controller, 15 s for the
rules baseline), over everything served since it was last asked. The demands are then fitted
to the node (``arbitrate``, each model kept at its minimum cores) and every controller is told
what it was granted, which is the anti-windup of its next step (Algorithm 2's last line: "the
state of each CT Controller is updated using u'").

That write-back starts at construction: the initial demands are fitted to the node like any
others, and each controller starts from what its executor was really given, not from what it
asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controllers.base import CoreController, Window
from supervisor.arbitration import arbitrate, arbitrate_by_deficit

# How the demands are fitted to the node under contention: ROMA Algorithm 2's proportional
# eta, or ours, the models furthest from their targets first (supervisor/arbitration.py).
GRANT_RULES = ("proportional", "deficit")

__all__ = ["Allocation", "NodeSupervisor", "Window"]


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
        min_cores: Mapping[str, float] | None = None,
        now: float = 0.0,
        tick_s: float = 1.0,
        grant_rule: str = "proportional",
        setpoint_ratio: float = 0.8,
    ):
        if grant_rule not in GRANT_RULES:
            raise ValueError(f"unknown grant rule {grant_rule!r}: one of {', '.join(GRANT_RULES)}")
        self.grant_rule, self.setpoint_ratio = grant_rule, setpoint_ratio
        self.controllers = dict(controllers)
        self.node_cores, self.reserved_cores, self.spare_share = node_cores, reserved_cores, spare_share
        self.min_cores = dict(min_cores or {})
        self.tick_s = tick_s
        self._demands = dict(initial_cores)
        # Each model's last measured response time over its set point (0: on target or idle).
        self.deficits = {name: 0.0 for name in controllers}
        self._pending = {name: Window() for name in controllers}
        self._due = {name: now + c.period_s for name, c in controllers.items()}
        #: The initial demands fitted to the node: what the executors start with, and (written
        #: back into every controller) the state each controller's first step starts from.
        self.initial = self.grant()

    def replace(self, name: str, controller: CoreController, demand: float, now: float, min_cores: float | None = None) -> None:
        """Put another controller in charge of a model (an operator's pin, or its release).

        ``min_cores``, when given, becomes the model's floor in the arbitration. The caller then
        calls ``grant`` to fit the new demand to the node and write it back.
        """
        self.controllers[name] = controller
        self._demands[name] = demand
        if min_cores is not None:
            self.min_cores[name] = min_cores
        self._pending[name] = Window()
        self._due[name] = now + controller.period_s

    def floors(self) -> float:
        """The cores the arbitration promises the models now, whatever the others ask: each one's
        minimum, or its demand where that is lower."""
        return sum(max(0.0, min(demand, self.min_cores.get(name, 0.0))) for name, demand in self._demands.items())

    def remove(self, name: str) -> None:
        """A model unloaded at run time: its cores go back to the others at the next grant."""
        for table in (self.controllers, self._demands, self.min_cores, self.deficits, self._pending, self._due):
            table.pop(name, None)

    def step(self, now: float, served: Mapping[str, Window], sla_ms: Mapping[str, float]) -> dict[str, Allocation]:
        for name, controller in self.controllers.items():
            window = self._pending[name]
            if name in served:
                window.merge(served[name])
            # Half a tick of tolerance: timers fire a little early or late, and a period must
            # never be skipped (nor taken twice) for that.
            if now >= self._due[name] - self.tick_s / 2:
                response = window.response_ms
                self.deficits[name] = response / (self.setpoint_ratio * sla_ms[name]) if response else 0.0
                self._demands[name] = controller.demand(window, sla_ms[name])
                self._pending[name] = Window()
                self._due[name] = now + controller.period_s
        return self.grant()

    def raise_demand(self, name: str, demand: float) -> dict[str, Allocation]:
        """A controller asked for more between periods (``FeedForwardController.react``): fit
        the new demand to the node now."""
        self._demands[name] = max(self._demands[name], demand)
        return self.grant()

    def grant(self) -> dict[str, Allocation]:
        """Fit the current demands to the node (ROMA Algorithm 2, or the deficit-weighted share) and tell
        every controller what it was granted."""
        if self.grant_rule == "deficit":
            granted = arbitrate_by_deficit(
                self._demands, self.deficits, self.node_cores, self.reserved_cores, self.spare_share, self.min_cores
            )
        else:
            granted = arbitrate(self._demands, self.node_cores, self.reserved_cores, self.spare_share, self.min_cores)
        for name, controller in self.controllers.items():
            controller.granted(granted[name])
        return {name: Allocation(self._demands[name], granted[name]) for name in self.controllers}
