"""The planner's input: a pipeline's steps, edges and paths with SLAs, and the request rate.

Plain typed data, no gateway imports. A step runs on one of its devices (a CPU executor with a given
number of cores, or a GPU), each with a price per instance and a latency model d(b). A path is a
sequence of steps from an entry to an exit with its own end-to-end SLA (FA2 Section IV-C); its
worst-case latency is the sum of its steps' worst-case latencies (FA2's IP (3), Harpagon's GetLat).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class BatchLatency(Protocol):
    def duration(self, batch: int) -> float: ...

    def throughput(self, batch: int) -> float: ...


@dataclass(frozen=True)
class Device:
    """One kind of instance a step can run on: ``price`` per instance (cores x a core's price for a
    CPU executor, a GPU's price for a GPU), its latency model and the batch sizes allowed on it."""

    name: str
    price: float
    latency: BatchLatency
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Step:
    """A model of the pipeline. ``rate_share`` is the requests it sees per pipeline request (1.0 when
    every request visits it, as in a fork-join pipeline; FA2's lambda_s / lambda where requests take
    one of several paths)."""

    name: str
    devices: tuple[Device, ...]
    rate_share: float = 1.0


@dataclass(frozen=True)
class Path:
    steps: tuple[str, ...]
    sla_s: float


# How requests arrive, for a step's worst case: evenly spaced (FA2's and Harpagon's model) or
# Poisson (planner/queueing.py, our addition: a percentile of the queue's wait is planned for).
EVEN, POISSON = "even", "poisson"


@dataclass(frozen=True)
class Pipeline:
    steps: tuple[Step, ...]
    edges: tuple[tuple[str, str], ...]
    paths: tuple[Path, ...]
    rate: float
    arrivals: str = EVEN
    _by_name: dict[str, Step] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {step.name: step for step in self.steps}
        if len(by_name) != len(self.steps):
            raise ValueError("step names must be unique")
        for source, target in self.edges:
            if source not in by_name or target not in by_name:
                raise ValueError(f"edge {source}->{target} names an unknown step")
        edge_set = set(self.edges)
        for path in self.paths:
            if any(name not in by_name for name in path.steps):
                raise ValueError(f"path {path.steps} names an unknown step")
            if any((a, b) not in edge_set for a, b in zip(path.steps, path.steps[1:], strict=False)):
                raise ValueError(f"path {path.steps} follows a missing edge")
        if self.arrivals not in (EVEN, POISSON):
            raise ValueError(f"arrivals must be {EVEN!r} or {POISSON!r}, not {self.arrivals!r}")
        object.__setattr__(self, "_by_name", by_name)

    def step(self, name: str) -> Step:
        return self._by_name[name]

    def step_rate(self, name: str) -> float:
        return self.rate * self._by_name[name].rate_share

    def topological_order(self) -> tuple[str, ...]:
        """Kahn's order, ties broken by the steps' declared order so plans are repeatable."""
        indegree = {step.name: 0 for step in self.steps}
        for _, target in self.edges:
            indegree[target] += 1
        order: list[str] = []
        ready = [step.name for step in self.steps if indegree[step.name] == 0]
        while ready:
            name = ready.pop(0)
            order.append(name)
            for source, target in self.edges:
                if source == name:
                    indegree[target] -= 1
                    if indegree[target] == 0:
                        ready.append(target)
        if len(order) != len(self.steps):
            raise ValueError("the pipeline's edges form a cycle")
        return tuple(order)

    def parents(self, name: str) -> tuple[str, ...]:
        return tuple(source for source, target in self.edges if target == name)

    def children(self, name: str) -> tuple[str, ...]:
        return tuple(target for source, target in self.edges if source == name)
