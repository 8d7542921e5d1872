"""The exhaustive search the planner is checked against: every device, batch size and instance count
per step, the cheapest combination whose every path meets its SLA. ``prune`` keeps it exact but
faster: only each step's latency-cost frontier (a dominated configuration never helps), the fewest
stable instances, and branch and bound on cost and on each path's latency so far."""

from __future__ import annotations

import itertools
import math

from planner.pipeline import Pipeline
from planner.plan_types import LATENCY_TOLERANCE_S, Plan, plan_from_choices
from planner.step_options import StepChoice, all_choices, instances_needed, step_frontiers, step_latency

MAX_EXTRA_INSTANCES = 2  # without pruning: also n_min + 1 and n_min + 2 instances per configuration


def _every_configuration(pipeline: Pipeline, step: str) -> list[StepChoice]:
    rate = pipeline.step_rate(step)
    found = []
    for least in (c for c in all_choices(pipeline, step) if c.instances == min_instances(pipeline, step, c)):
        device = next(d for d in pipeline.step(step).devices if d.name == least.device)
        duration = device.latency.duration(least.batch)
        for extra in range(MAX_EXTRA_INSTANCES + 1):
            n = least.instances + extra
            assert n * least.batch / duration >= rate * (1 - 1e-9)
            found.append(
                StepChoice(
                    step,
                    device.name,
                    least.batch,
                    n,
                    step_latency(duration, least.batch, rate, n, pipeline.arrivals),
                    n * device.price,
                )
            )
    return found


def min_instances(pipeline: Pipeline, step: str, option: StepChoice) -> int:
    device = next(d for d in pipeline.step(step).devices if d.name == option.device)
    return instances_needed(pipeline.step_rate(step), option.batch / device.latency.duration(option.batch))


def brute_force_plan(pipeline: Pipeline, prune: bool = True) -> Plan | None:
    order = pipeline.topological_order()
    if not prune:
        options = [_every_configuration(pipeline, name) for name in order]
        best: tuple[float, tuple[StepChoice, ...]] | None = None
        for combo in itertools.product(*options):
            plan = plan_from_choices(pipeline, dict(zip(order, combo, strict=True)))
            if plan.feasible and (best is None or plan.cost < best[0]):
                best = (plan.cost, combo)
        return None if best is None else plan_from_choices(pipeline, dict(zip(order, best[1], strict=True)))

    frontiers = step_frontiers(pipeline)
    fastest = {name: min(c.latency_s for c in frontiers[name]) for name in order}
    cheapest = {name: min(c.cost for c in frontiers[name]) for name in order}
    position = {name: i for i, name in enumerate(order)}
    paths = [(path.sla_s, [position[s] for s in path.steps]) for path in pipeline.paths]
    best_cost = math.inf
    best_choice: list[StepChoice] = []
    chosen: list[StepChoice] = []

    def search(depth: int, cost: float) -> None:
        nonlocal best_cost, best_choice
        if cost + sum(cheapest[name] for name in order[depth:]) >= best_cost - 1e-12:
            return
        if depth == len(order):
            best_cost, best_choice = cost, list(chosen)
            return
        for option in frontiers[order[depth]]:
            chosen.append(option)
            ok = True
            for sla, steps in paths:
                spent = sum(chosen[i].latency_s if i <= depth else fastest[order[i]] for i in steps)
                if spent > sla + LATENCY_TOLERANCE_S:
                    ok = False
                    break
            if ok:
                search(depth + 1, cost + option.cost)
            chosen.pop()

    search(0, 0.0)
    return None if math.isinf(best_cost) else plan_from_choices(pipeline, dict(zip(order, best_choice, strict=True)))
