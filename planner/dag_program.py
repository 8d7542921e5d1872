"""FA2's autoscaling algorithm (Section IV-D and IV-E): graph transformation, then the dynamic program
of Algorithm 1 choosing per DNN the number of instances and the batch size.

Graph transformation (IV-D): while some DNN has several parents (an ingress aggregator), remove its
incoming edge of the lowest sharing degree (the number of paths using the edge) and split every path
using it in two, the first segment's SLA by eq. (4): SLA_p1 = SLA_p x sum(Int, p1) / sum(Int, p),
Int_s the mean processing time over batch sizes 1-16.

Dynamic program (IV-E): OPT(s, t) = min over b with l_s(b) <= t of ceil(lambda_s / h_s(b)) + sum over
successors m of OPT(m, t_m) (eq. (5), (7)), l_s(b) = d_s(b) + (b - 1) / lambda_s (eq. (2)), where
t_m = min(SLA_p, t - l_s(b)) for m the first DNN of a path p and t - l_s(b) otherwise; budgets are
whole time slots (1 ms in the paper). Instances are priced by their device (FA2 counts instances: all
prices 1), and the choice among devices is part of the minimum. The paper's pseudo-code line 9 counts
ceil(lambda / (b floor(t / p))) instances for a DNN without successors; eq. (5) counts
ceil(lambda / h(b)), which is what is used here. Ties go to the smaller batch (the penalty delta).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from planner.pipeline import Pipeline
from planner.plan_types import Plan, plan_from_choices
from planner.step_options import StepChoice, all_choices

SLOT_S = 0.001  # FA2 Section IV-E: "time slots (of 1 ms length)"
INTENSITY_BATCHES = range(1, 17)  # FA2 Section IV-D: "we use batch sizes in [1, 16]"


@dataclass(frozen=True)
class Segment:
    steps: tuple[str, ...]
    sla_s: float


@dataclass(frozen=True)
class TransformedGraph:
    edges: tuple[tuple[str, str], ...]
    segments: tuple[Segment, ...]


def intensity(pipeline: Pipeline, step: str) -> float:
    """Int_s: the mean processing time over batch sizes 1-16 (over every device of the step)."""
    times = [
        device.latency.duration(b) for device in pipeline.step(step).devices for b in device.batch_sizes if b in INTENSITY_BATCHES
    ]
    if not times:
        times = [device.latency.duration(min(device.batch_sizes)) for device in pipeline.step(step).devices]
    return sum(times) / len(times)


def sharing_degree(segments: tuple[Segment, ...], edge: tuple[str, str]) -> int:
    return sum(1 for seg in segments if edge in zip(seg.steps, seg.steps[1:], strict=False))


def transform(pipeline: Pipeline) -> TransformedGraph:
    """Section IV-D: remove edges until no DNN has two parents, splitting the paths that used them."""
    edges = list(pipeline.edges)
    segments = tuple(Segment(p.steps, p.sla_s) for p in pipeline.paths)
    intensities = {step.name: intensity(pipeline, step.name) for step in pipeline.steps}
    for node in pipeline.topological_order():
        while True:
            incoming = [e for e in edges if e[1] == node]
            if len(incoming) <= 1:
                break
            removed = min(incoming, key=lambda e: sharing_degree(segments, e))
            edges.remove(removed)
            split: list[Segment] = []
            for seg in segments:
                pairs = list(zip(seg.steps, seg.steps[1:], strict=False))
                if removed not in pairs:
                    split.append(seg)
                    continue
                cut = pairs.index(removed) + 1
                first, second = seg.steps[:cut], seg.steps[cut:]
                share = sum(intensities[s] for s in first) / sum(intensities[s] for s in seg.steps)  # eq. (4)
                split.extend([Segment(first, seg.sla_s * share), Segment(second, seg.sla_s * (1 - share))])
            segments = tuple(split)
    return TransformedGraph(tuple(edges), segments)


def fa2_plan(pipeline: Pipeline, slot_s: float = SLOT_S) -> Plan | None:
    """FA2 alone: the transformation, then Algorithm 1; None where no configuration meets the SLAs."""
    graph = transform(pipeline)
    children = {s.name: [t for (f, t) in graph.edges if f == s.name] for s in pipeline.steps}
    has_parent = {t for _, t in graph.edges}
    starts: dict[str, float] = {}
    for seg in graph.segments:
        starts[seg.steps[0]] = min(starts.get(seg.steps[0], math.inf), seg.sla_s)
    options = {s.name: sorted(all_choices(pipeline, s.name), key=lambda c: (c.batch, c.cost)) for s in pipeline.steps}
    t_max = math.floor(max(p.sla_s for p in pipeline.paths) / slot_s + 1e-9)

    def budget_for(child: str, remaining_slots: int) -> int:
        if child in starts:
            return min(remaining_slots, math.floor(starts[child] / slot_s + 1e-9))
        return remaining_slots

    @cache
    def opt(step: str, slots: int) -> tuple[float, StepChoice | None]:
        best: tuple[float, StepChoice | None] = (math.inf, None)
        for option in options[step]:
            if option.latency_s > slots * slot_s + 1e-12:
                continue
            left = math.floor((slots * slot_s - option.latency_s) / slot_s + 1e-9)
            total = option.cost + sum(opt(m, budget_for(m, left))[0] for m in children[step])
            if total < best[0]:
                best = (total, option)
        return best

    choices: dict[str, StepChoice] = {}

    def backtrack(step: str, slots: int) -> None:
        _, option = opt(step, slots)
        assert option is not None
        choices[step] = option
        left = math.floor((slots * slot_s - option.latency_s) / slot_s + 1e-9)
        for m in children[step]:
            backtrack(m, budget_for(m, left))

    for root in (s.name for s in pipeline.steps if s.name not in has_parent):
        slots = budget_for(root, t_max)  # the artificial s0 hands t_max to each first DNN
        if math.isinf(opt(root, slots)[0]):
            return None
        backtrack(root, slots)
    return plan_from_choices(pipeline, choices)
