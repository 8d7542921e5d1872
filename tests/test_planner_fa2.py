"""FA2 (Section IV): the quadratic latency model and its fit, the graph transformation, the dynamic
program. FA2's text gives no worked numbers that its profiles would let us reproduce (Fig. 3's
"3x and 2x" over Gurobi comes without the models' parameters), so these check its rules."""

import random

import numpy as np
import pytest

from planner.brute_force import brute_force_plan
from planner.dag_program import fa2_plan, intensity, sharing_degree, transform
from planner.latency_model import LatencyModel
from planner.pipeline import Device, Path, Pipeline, Step
from planner.synthetic import random_pipeline


def test_fit_recovers_a_quadratic_from_its_points():
    truth = LatencyModel(0.0004, 0.003, 0.011)
    points = [(b, truth.duration(b)) for b in (1, 2, 4, 8, 16, 32)]
    fitted = LatencyModel.fit(points)
    assert (fitted.quadratic_s, fitted.per_item_s, fitted.fixed_s) == pytest.approx((0.0004, 0.003, 0.011))
    assert fitted.throughput(8) == pytest.approx(8 / truth.duration(8))


def test_fit_of_noisy_points_is_least_squares():
    rng = np.random.default_rng(3)
    batches = np.repeat([1, 2, 4, 8, 16], 20)
    seconds = 0.0002 * batches**2 + 0.004 * batches + 0.01 + rng.normal(0, 0.0005, batches.size)
    fitted = LatencyModel.fit(list(zip(batches.tolist(), seconds.tolist(), strict=True)))
    expected = np.polyfit(batches, seconds, 2)
    assert (fitted.quadratic_s, fitted.per_item_s, fitted.fixed_s) == pytest.approx(tuple(expected))


def test_two_batch_sizes_fit_the_gateways_line_alpha_zero():
    fitted = LatencyModel.fit([(1, 0.012), (4, 0.021), (4, 0.021)])
    assert fitted.quadratic_s == 0.0
    assert fitted == pytest.approx(LatencyModel.linear(0.003, 0.009)) or (fitted.per_item_s, fitted.fixed_s) == pytest.approx(
        (0.003, 0.009)
    )


def fig5_pipeline() -> Pipeline:
    """Fig. 5's shape: two paths share s1 and s4 fork-join; a third path also uses s3 -> s4."""
    device = Device("cpu-1", 1.0, LatencyModel.linear(0.002, 0.004), (1, 2, 4, 8))
    slow = Device("cpu-1", 1.0, LatencyModel.linear(0.006, 0.008), (1, 2, 4, 8))
    steps = (Step("s1", (device,)), Step("s2", (slow,)), Step("s3", (device,)), Step("s4", (device,)), Step("s5", (device,)))
    edges = (("s1", "s2"), ("s1", "s3"), ("s2", "s4"), ("s3", "s4"), ("s3", "s5"), ("s5", "s4"))
    paths = (Path(("s1", "s2", "s4"), 0.2), Path(("s1", "s3", "s4"), 0.15), Path(("s1", "s3", "s5", "s4"), 0.3))
    return Pipeline(steps, edges, paths, rate=100.0)


def test_transformation_removes_the_least_shared_edges_and_splits_slas_by_intensity():
    pipeline = fig5_pipeline()
    graph = transform(pipeline)
    parents = {}
    for source, target in graph.edges:
        parents.setdefault(target, []).append(source)
    assert all(len(p) == 1 for p in parents.values())  # no ingress aggregator is left
    removed = set(pipeline.edges) - set(graph.edges)
    original = tuple(graph.segments)
    for edge in removed:
        kept_into_same = [e for e in pipeline.edges if e[1] == edge[1] and e not in removed]
        assert all(
            sharing_degree(tuple(pipeline_paths(pipeline)), edge) <= sharing_degree(tuple(pipeline_paths(pipeline)), k)
            for k in kept_into_same
        )
    # Each path's segments cover it and their SLAs add up to its SLA, in the ratio of eq. (4).
    for path in pipeline.paths:
        pieces = [s for s in original if set(s.steps) <= set(path.steps)]
        joined = [n for s in pieces for n in s.steps]
        if sorted(joined) == sorted(path.steps) and len(pieces) == 2:
            assert sum(s.sla_s for s in pieces) == pytest.approx(path.sla_s)
            first = pieces[0]
            share = sum(intensity(pipeline, n) for n in first.steps) / sum(intensity(pipeline, n) for n in path.steps)
            assert first.sla_s == pytest.approx(path.sla_s * share)


def pipeline_paths(pipeline):
    from planner.dag_program import Segment

    return [Segment(p.steps, p.sla_s) for p in pipeline.paths]


def whole_millisecond_chain(rng: random.Random, length: int) -> Pipeline:
    """Latencies in whole milliseconds at 1,000 req/s ((b - 1) / lambda is b - 1 ms), so FA2's 1 ms
    slots lose nothing and its program is exact on a chain."""
    steps = []
    for i in range(length):
        devices = (
            Device("cpu", 2.0, LatencyModel.linear(rng.randint(2, 6) / 1000, rng.randint(2, 9) / 1000), (1, 2, 4, 8)),
            Device("gpu", 7.0, LatencyModel.linear(rng.randint(0, 1) / 1000, rng.randint(3, 8) / 1000), (1, 2, 4, 8)),
        )
        steps.append(Step(f"m{i}", devices))
    names = [s.name for s in steps]
    return Pipeline(
        tuple(steps), tuple(zip(names, names[1:], strict=False)), (Path(tuple(names), rng.randint(25, 60) / 1000),), 1000.0
    )


@pytest.mark.parametrize("seed", range(6))
def test_fa2_program_is_optimal_on_chains_with_whole_millisecond_latencies(seed):
    pipeline = whole_millisecond_chain(random.Random(seed), 3)
    optimum = brute_force_plan(pipeline, prune=False)
    plan = fa2_plan(pipeline)
    assert (plan is None) == (optimum is None)
    if optimum is not None:
        assert plan.feasible
        assert plan.cost == pytest.approx(optimum.cost)


@pytest.mark.parametrize("seed", range(8))
def test_fa2_plans_meet_every_path_sla_and_never_beat_the_optimum(seed):
    pipeline = random_pipeline(random.Random(seed), 5)
    optimum = brute_force_plan(pipeline)
    plan = fa2_plan(pipeline)
    if plan is not None:
        assert plan.feasible
        assert plan.cost >= optimum.cost - 1e-9
