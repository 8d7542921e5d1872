"""What a planner returns: a configuration per step, the cost and each path's predicted worst case."""

from __future__ import annotations

from dataclasses import dataclass

from planner.pipeline import Pipeline
from planner.step_options import StepChoice

# Sums of float latencies miss a deadline they meet by a few ulps: this much is taken as met.
LATENCY_TOLERANCE_S = 1e-9


@dataclass(frozen=True)
class PathLatency:
    steps: tuple[str, ...]
    sla_s: float
    worst_case_s: float

    @property
    def met(self) -> bool:
        return self.worst_case_s <= self.sla_s + LATENCY_TOLERANCE_S


@dataclass(frozen=True)
class Plan:
    """One configuration per step (device, batch, instances); ``cost`` is the sum of instances x price."""

    choices: dict[str, StepChoice]
    cost: float
    paths: tuple[PathLatency, ...]

    @property
    def feasible(self) -> bool:
        return all(path.met for path in self.paths)


def plan_from_choices(pipeline: Pipeline, choices: dict[str, StepChoice]) -> Plan:
    paths = tuple(
        PathLatency(path.steps, path.sla_s, sum(choices[name].latency_s for name in path.steps)) for path in pipeline.paths
    )
    return Plan(dict(choices), sum(c.cost for c in choices.values()), paths)
