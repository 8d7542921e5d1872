"""Our cost planner for multi-model pipelines, and the baselines it is measured against.

``plan_pipeline`` (ours) solves FA2's problem (IP (3): per step a device, a batch size and instances,
every path's worst case within its SLA, least total price) without FA2's two approximations:
- FA2's dynamic program passes one time budget per DNN in 1 ms slots, so paths of different SLAs
  through a DNN all get the tightest one. Here each step's value is a step function of the latency
  already spent above it, f_s(e) = min over configurations o of cost(o) + sum over children c of
  f_c(e + l(o)), feasible while every path ending at s has e + l(o) within its SLA; the function is
  kept exactly as its breakpoints (a latency-cost frontier), no slots. On a graph without joins this
  is the optimum of the model (step_options.py), the same as the exhaustive search.
- At a join (a step with several parents) FA2 removes edges and splits SLAs by intensity (eq. (4)).
  Here every incoming edge of a join J (and of a step where a path starts, if it has a parent) is
  cut and each path p through J is given an arrival x_(J,p)
  at J, in seconds after the request arrived: p's segment reaching J's parent must end by it, the one
  leaving J has the rest of p's SLA (paths are summed, FA2's IP (3), so each has its own). The
  arrivals are searched from seeds (those of feasible plans, and common shares of each SLA) by moves
  of one arrival over the latencies the steps above J can take (every sum of frontier latencies along
  the path to J, thinned to ``MAX_DEADLINES`` values) and of all of a join's arrivals shifted
  together, until a sweep changes nothing; then one or two steps' configurations of the result are
  exchanged while that lowers the cost, and the arrivals of the exchanged plan seed a second search.
  This search is where the planner can miss the optimum; benchmarks/planner_vs_brute_force.py counts
  how often.
Batch-aware dispatch (Harpagon Section III-B) is the latency model: d(b) + (b - 1) / lambda.

Baselines, the papers' rules: ``even_split_plan`` (each path's SLA split evenly over its steps, the
Clipper baseline of Harpagon Section IV-A), ``fa2_plan`` (dag_program.py), ``harpagon_plan``
(latency_split.py).
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass

from planner.pipeline import Pipeline
from planner.plan_types import LATENCY_TOLERANCE_S, Plan, plan_from_choices
from planner.step_options import StepChoice, all_choices, frontier, step_frontiers

MAX_DEADLINES = 32  # arrival times tried per (join, path) and sweep
MAX_SWEEPS = 3
SEED_SHARES = tuple(i / 8 for i in range(1, 8))  # paths reaching their joins at 1/8 ... 7/8 of their SLA


@dataclass(frozen=True)
class _Entry:
    """f_s holds: with at most ``max_spent`` seconds spent above s, ``cost`` is reachable."""

    max_spent: float
    cost: float
    choice: StepChoice
    child_entries: tuple[int, ...]


def _pareto(entries: list[_Entry]) -> list[_Entry]:
    kept: list[_Entry] = []
    for entry in sorted(entries, key=lambda e: (-e.max_spent, e.cost)):
        if not kept or entry.cost < kept[-1].cost:
            kept.append(entry)
    kept.reverse()  # increasing max_spent, increasing cost
    return kept


class _ForestProgram:
    """The exact program on a forest whose every constraint is 'the latency from my tree's root to the
    end of this segment is within a deadline'."""

    def __init__(self, frontiers: dict[str, list[StepChoice]], children: dict[str, list[str]], deadlines: dict[str, float]):
        self.frontiers = frontiers
        self.children = children
        self.deadlines = deadlines  # per step: the least deadline of the segments ending there
        self.tables: dict[str, list[_Entry]] = {}

    def table(self, step: str) -> list[_Entry]:
        if step in self.tables:
            return self.tables[step]
        kids = self.children[step]
        kid_tables = [self.table(k) for k in kids]
        kid_keys = [[e.max_spent for e in t] for t in kid_tables]
        entries: list[_Entry] = []
        end = self.deadlines.get(step, math.inf)
        for option in self.frontiers[step]:
            cap = end - option.latency_s
            candidates = {cap} if not math.isinf(cap) else set()
            for table in kid_tables:
                candidates.update(e.max_spent - option.latency_s for e in table)
            if not candidates:
                candidates = {math.inf}  # on no path's end and no children: nothing bounds it
            for spent in candidates:
                if spent > cap + LATENCY_TOLERANCE_S or spent < -LATENCY_TOLERANCE_S - option.latency_s:
                    continue
                reached = spent + option.latency_s
                picks: list[int] = []
                cost = option.cost
                for table, keys in zip(kid_tables, kid_keys, strict=True):
                    index = bisect.bisect_left(keys, reached - LATENCY_TOLERANCE_S)
                    if index == len(table):
                        break
                    picks.append(index)
                    cost += table[index].cost
                else:
                    entries.append(_Entry(min(spent, cap), cost, option, tuple(picks)))
        self.tables[step] = _pareto(entries)
        return self.tables[step]

    def solve(self, root: str) -> tuple[float, dict[str, StepChoice]]:
        table = self.table(root)
        index = bisect.bisect_left([e.max_spent for e in table], -LATENCY_TOLERANCE_S)
        if index == len(table):
            return math.inf, {}
        choices: dict[str, StepChoice] = {}
        stack = [(root, index)]
        while stack:
            step, at = stack.pop()
            entry = self.tables[step][at]
            choices[step] = entry.choice
            stack.extend(zip(self.children[step], entry.child_entries, strict=True))
        return table[index].cost, choices


def joins(pipeline: Pipeline) -> tuple[str, ...]:
    return tuple(name for name in pipeline.topological_order() if len(pipeline.parents(name)) > 1)


Crossing = tuple[str, int]  # (join, index of a path through it)


def _solve_with_deadlines(
    pipeline: Pipeline, frontiers: dict[str, list[StepChoice]], cut_steps: frozenset[str], arrivals: dict[Crossing, float]
) -> tuple[float, dict[str, StepChoice]]:
    """Cut every edge into a join; path p then runs in segments between its joins, the one reaching
    join J due ``arrivals[(J, p)]`` seconds after the request arrived, the last one at the SLA; the
    forest's program gives the cost."""
    children = {s.name: [c for c in pipeline.children(s.name) if c not in cut_steps] for s in pipeline.steps}
    deadlines: dict[str, float] = {}
    for index, path in enumerate(pipeline.paths):
        start_offset = 0.0
        for position, step in enumerate(path.steps):
            following = path.steps[position + 1] if position + 1 < len(path.steps) else None
            if following is None or following in cut_steps:
                end = path.sla_s if following is None else arrivals[(following, index)]
                deadlines[step] = min(deadlines.get(step, math.inf), end - start_offset)
                if following is not None:
                    start_offset = arrivals[(following, index)]
    program = _ForestProgram(frontiers, children, deadlines)
    has_parent = {c for kids in children.values() for c in kids}
    total, choices = 0.0, {}
    for root in (s.name for s in pipeline.steps if s.name not in has_parent):
        cost, picked = program.solve(root)
        if math.isinf(cost):
            return math.inf, {}
        total += cost
        choices.update(picked)
    return total, choices


def _thin(values: set[float], keep: int) -> list[float]:
    ordered = sorted(values)
    if len(ordered) <= keep:
        return ordered
    return sorted({ordered[round(i * (len(ordered) - 1) / (keep - 1))] for i in range(keep)})


def _arrival_candidates(pipeline: Pipeline, frontiers: dict[str, list[StepChoice]], crossing: Crossing) -> list[float]:
    """The times after arrival at which path p can reach join J: every sum of frontier latencies of
    its steps before J, thinned evenly to MAX_DEADLINES values."""
    join, index = crossing
    path = pipeline.paths[index]
    reached = {0.0}
    for step in path.steps[: path.steps.index(join)]:
        reached = set(_thin({r + c.latency_s for r in reached for c in frontiers[step]}, 4 * MAX_DEADLINES))
    return _thin(reached, MAX_DEADLINES)


def _arrivals_of(pipeline: Pipeline, crossings: list[Crossing], choices: dict[str, StepChoice]) -> dict[Crossing, float]:
    """The arrivals a feasible plan implies: each path's time before the join plus its share of the
    path's slack in proportion, so that the plan stays feasible under them."""
    arrivals = {}
    for join, index in crossings:
        path = pipeline.paths[index]
        before = sum(choices[s].latency_s for s in path.steps[: path.steps.index(join)])
        total = sum(choices[s].latency_s for s in path.steps)
        arrivals[(join, index)] = before + (path.sla_s - total) * (before / total if total > 0 else 0.0)
    return arrivals


def _search_arrivals(
    pipeline: Pipeline,
    frontiers: dict[str, list[StepChoice]],
    cut_steps: frozenset[str],
    crossings: list[Crossing],
    seeds: list[dict[Crossing, float]],
) -> tuple[float, dict[str, StepChoice]]:
    best_cost, best_choices, arrivals = math.inf, {}, {}
    for trial in seeds:
        cost, choices = _solve_with_deadlines(pipeline, frontiers, cut_steps, trial)
        if cost < best_cost:
            best_cost, best_choices, arrivals = cost, choices, trial
    if math.isinf(best_cost):
        return best_cost, best_choices
    join_steps = {j for j, _ in crossings}
    candidates = {c: _arrival_candidates(pipeline, frontiers, c) for c in crossings}
    by_join = {j: [c for c in crossings if c[0] == j] for j in join_steps}
    for _ in range(MAX_SWEEPS):
        changed = False
        moves: list[dict[Crossing, float]] = []
        for crossing in crossings:  # one path's arrival at one join
            moves.extend({crossing: value} for value in candidates[crossing])
        for members in by_join.values():  # every path's arrival at a join, shifted together
            shifts = _thin({v - arrivals[c] for c in members for v in candidates[c]}, MAX_DEADLINES)
            moves.extend({c: arrivals[c] + shift for c in members} for shift in shifts)
        for move in moves:
            trial = {**arrivals, **move}
            cost, choices = _solve_with_deadlines(pipeline, frontiers, cut_steps, trial)
            if cost < best_cost - 1e-12:
                best_cost, best_choices, arrivals, changed = cost, choices, trial, True
        if not changed:
            break
    return best_cost, best_choices


def _exchange(
    pipeline: Pipeline, frontiers: dict[str, list[StepChoice]], choices: dict[str, StepChoice]
) -> dict[str, StepChoice]:
    """Local search on the plan itself: one step's configuration, or two steps' at once, changed to
    any on their frontiers while every SLA holds and the cost falls, until none does."""
    best = plan_from_choices(pipeline, choices)
    names = list(frontiers)
    improved = True
    while improved:
        improved = False
        for first, second in itertools.combinations_with_replacement(names, 2):
            for a in frontiers[first]:
                for b in frontiers[second] if second != first else (a,):
                    trial = {**best.choices, first: a, second: b}
                    plan = plan_from_choices(pipeline, trial)
                    if plan.feasible and plan.cost < best.cost - 1e-12:
                        best, improved = plan, True
    return best.choices


def plan_pipeline(pipeline: Pipeline) -> Plan | None:
    """The cheapest plan found (ours); None where no configuration meets every path's SLA."""
    frontiers = step_frontiers(pipeline)
    # Cut where a step has several parents, and where a path starts at a step that has a parent
    # (FA2's Table III: SUMR -> QUAN starts at SUMR, which AUTT feeds): each becomes a tree's root.
    cut_steps = frozenset(joins(pipeline)) | {p.steps[0] for p in pipeline.paths if pipeline.parents(p.steps[0])}
    if not cut_steps:
        cost, choices = _solve_with_deadlines(pipeline, frontiers, cut_steps, {})
        return None if math.isinf(cost) else plan_from_choices(pipeline, choices)
    crossings = [(j, i) for i, path in enumerate(pipeline.paths) for j in path.steps[1:] if j in cut_steps]
    fastest = plan_from_choices(pipeline, {name: options[0] for name, options in frontiers.items()})
    if not fastest.feasible:
        return None
    # Seeds: the arrivals implied by feasible plans (the fastest one, and the even split where it
    # finds one), and each path reaching its joins at a common share of its SLA.
    seeds = [_arrivals_of(pipeline, crossings, p.choices) for p in (fastest, even_split_plan(pipeline)) if p is not None]
    seeds += [{(j, i): share * pipeline.paths[i].sla_s for j, i in crossings} for share in SEED_SHARES]
    best_cost, best_choices = _search_arrivals(pipeline, frontiers, cut_steps, crossings, seeds)
    if math.isinf(best_cost):
        return None
    # The arrival search is local: a plan one or two configurations away may be cheaper, and its
    # arrivals seed a second search.
    exchanged = _exchange(pipeline, frontiers, best_choices)
    cost, choices = _search_arrivals(pipeline, frontiers, cut_steps, crossings, [_arrivals_of(pipeline, crossings, exchanged)])
    if cost < best_cost:
        best_cost, best_choices = cost, choices
    exchanged_cost = sum(c.cost for c in exchanged.values())
    if exchanged_cost < best_cost:
        best_cost, best_choices = exchanged_cost, exchanged
    return plan_from_choices(pipeline, best_choices)


def even_split_plan(pipeline: Pipeline) -> Plan | None:
    """Each path's SLA split evenly over its steps; a step's budget is the least of its paths'
    shares; each step takes its cheapest configuration within its budget."""
    choices: dict[str, StepChoice] = {}
    for step in pipeline.steps:
        budget = min(p.sla_s / len(p.steps) for p in pipeline.paths if step.name in p.steps)
        within = [c for c in frontier_of(pipeline, step.name) if c.latency_s <= budget + LATENCY_TOLERANCE_S]
        if not within:
            return None
        choices[step.name] = min(within, key=lambda c: (c.cost, c.latency_s))
    return plan_from_choices(pipeline, choices)


def frontier_of(pipeline: Pipeline, step: str) -> list[StepChoice]:
    return frontier(all_choices(pipeline, step))
