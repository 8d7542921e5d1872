"""Random pipelines with a fixed seed, for the tests and benchmarks/planner_vs_brute_force.py.

Each step may run on a 2-core or 4-core CPU executor (price 1 per core, Symphony's linear l(b)) or
a GPU (price 10, FA2's quadratic d(b)); every step after the first has a parent among the earlier
steps and, with probability ``join_probability``, a second one (a join). Paths are every route from
an entry to an exit, each with an SLA between 2 and 6 times its steps' fastest batch-1 latency with one
inter-arrival time each (Harpagon's d + b / T at b = 1)."""

from __future__ import annotations

import random

from planner.latency_model import LatencyModel
from planner.pipeline import Device, Path, Pipeline, Step

BATCH_SIZES = (1, 2, 4, 8, 16)
CORE_PRICE = 1.0
GPU_PRICE = 10.0


def _devices(rng: random.Random) -> tuple[Device, ...]:
    per_item, fixed = rng.uniform(0.004, 0.02), rng.uniform(0.002, 0.01)
    gpu = LatencyModel(rng.uniform(0.00001, 0.0001), rng.uniform(0.0005, 0.002), rng.uniform(0.004, 0.012))
    return (
        Device("cpu-2", 2 * CORE_PRICE, LatencyModel.linear(per_item, fixed), BATCH_SIZES),
        Device("cpu-4", 4 * CORE_PRICE, LatencyModel.linear(per_item / 1.8, fixed), BATCH_SIZES),
        Device("gpu", GPU_PRICE, gpu, BATCH_SIZES),
    )


def routes(steps: list[str], edges: list[tuple[str, str]]) -> list[tuple[str, ...]]:
    parents = {s: [a for a, b in edges if b == s] for s in steps}
    children = {s: [b for a, b in edges if a == s] for s in steps}
    found: list[tuple[str, ...]] = []

    def walk(route: tuple[str, ...]) -> None:
        if not children[route[-1]]:
            found.append(route)
        for child in children[route[-1]]:
            walk((*route, child))

    for entry in (s for s in steps if not parents[s]):
        walk((entry,))
    return found


def random_pipeline(rng: random.Random, step_count: int, join_probability: float = 0.3) -> Pipeline:
    names = [f"m{i}" for i in range(step_count)]
    edges: list[tuple[str, str]] = []
    for i in range(1, step_count):
        first = rng.randrange(i)
        edges.append((names[first], names[i]))
        if i >= 2 and rng.random() < join_probability:
            second = rng.choice([j for j in range(i) if j != first])
            edges.append((names[second], names[i]))
    rate = rng.uniform(20.0, 300.0)
    steps = tuple(Step(name, _devices(rng)) for name in names)
    by_name = {s.name: s for s in steps}
    paths = []
    for route in routes(names, edges):
        floor = sum(min(d.latency.duration(1) for d in by_name[s].devices) + 1 / rate for s in route)
        paths.append(Path(route, round(floor * rng.uniform(2.0, 6.0), 4)))
    return Pipeline(steps, tuple(edges), tuple(paths), rate=rate)
