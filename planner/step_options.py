"""One step's configurations in the planner's cost model, and their latency-cost frontier.

A configuration is (device, batch size b, instances n) with n the fewest instances whose throughput
n b / d(b) covers the step's rate lambda (FA2's stability constraint in IP (3)); its cost is
n x the device's price, and its worst-case latency under batch-aware dispatch from one queue is
d(b) + (b - 1) / lambda: the first request of a batch waits for b - 1 more (FA2 eq. (2)) and, with
n instances taking whole batches in turn, an instance is free when its next batch is complete
(FA2 Section IV-B; Harpagon's Theorem 1 with one configuration writes the collection time b / w).

Where the pipeline's arrivals are Poisson (our addition, planner/queueing.py) the latency is a
percentile instead: d(b), the batch's collection and its wait for an instance; a configuration may
then also take one or two instances past the fewest stable ones, which shortens the wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.pipeline import POISSON, Device, Pipeline
from planner.queueing import poisson_latency_s

# Rates times seconds come out as 4.000000000001 instances; this much is taken for rounding.
ROUNDING = 1e-9
# Under Poisson arrivals, instances past the fewest stable ones tried per configuration.
EXTRA_INSTANCES_POISSON = 2


@dataclass(frozen=True)
class StepChoice:
    step: str
    device: str
    batch: int
    instances: int
    latency_s: float
    cost: float


def instances_needed(rate: float, throughput: float) -> int:
    return max(1, math.ceil(rate / throughput - ROUNDING))


def worst_case_latency(duration_s: float, batch: int, rate: float) -> float:
    """Batch-aware dispatch from one queue: d(b) + (b - 1) / lambda."""
    return duration_s + (batch - 1) / rate


def step_latency(duration_s: float, batch: int, rate: float, instances: int, arrivals: str) -> float:
    """The step's planned latency: the worst case of evenly spaced arrivals, or Poisson's percentile."""
    if arrivals == POISSON:
        return poisson_latency_s(duration_s, batch, rate, instances)
    return worst_case_latency(duration_s, batch, rate)


def choice(step: str, device: Device, batch: int, rate: float, arrivals: str = "even", extra: int = 0) -> StepChoice:
    duration = device.latency.duration(batch)
    instances = instances_needed(rate, batch / duration) + extra
    latency = step_latency(duration, batch, rate, instances, arrivals)
    return StepChoice(step, device.name, batch, instances, latency, instances * device.price)


def all_choices(pipeline: Pipeline, step: str) -> list[StepChoice]:
    rate = pipeline.step_rate(step)
    extras = range(EXTRA_INSTANCES_POISSON + 1) if pipeline.arrivals == POISSON else (0,)
    return [
        choice(step, device, batch, rate, pipeline.arrivals, extra)
        for device in pipeline.step(step).devices
        for batch in device.batch_sizes
        for extra in extras
    ]


def frontier(choices: list[StepChoice]) -> list[StepChoice]:
    """The choices no other beats on both latency and cost, by increasing latency (decreasing cost).
    Dropping the others loses no optimum: every path constraint grows with latency, the objective
    with cost."""
    kept: list[StepChoice] = []
    for item in sorted(choices, key=lambda c: (c.latency_s, c.cost, c.batch)):
        if not kept or item.cost < kept[-1].cost:
            kept.append(item)
    return kept


def step_frontiers(pipeline: Pipeline) -> dict[str, list[StepChoice]]:
    return {step.name: frontier(all_choices(pipeline, step.name)) for step in pipeline.steps}
