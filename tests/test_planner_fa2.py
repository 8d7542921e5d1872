"""FA2 (Section IV): the quadratic latency model and its fit, the graph transformation, the dynamic
program. FA2's text gives no worked numbers that its profiles would let us reproduce (Fig. 3's
"3x and 2x" over Gurobi comes without the models' parameters), so these check its rules."""

import random

import numpy as np
import pytest

from planner.brute_force import brute_force_plan
from planner.dag_program import Segment, fa2_plan, intensity, sharing_degree, transform
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
    assert (fitted.per_item_s, fitted.fixed_s) == pytest.approx((0.003, 0.009))


def fig5_like_pipeline() -> Pipeline:
    """Fig. 5's fork-join (s1 -> s2 | s3 -> s4) with a second entry s0 into s3 and a branch s3 -> s5,
    so that the edges into each join have different sharing degrees."""
    fast = Device("cpu-1", 1.0, LatencyModel.linear(0.002, 0.004), (1, 2, 4, 8))
    slow = Device("cpu-1", 1.0, LatencyModel.linear(0.006, 0.008), (1, 2, 4, 8))
    steps = tuple(Step(n, (slow if n == "s2" else fast,)) for n in ("s0", "s1", "s2", "s3", "s4", "s5"))
    edges = (("s1", "s2"), ("s1", "s3"), ("s0", "s3"), ("s2", "s4"), ("s3", "s4"), ("s3", "s5"))
    paths = (
        Path(("s1", "s2", "s4"), 0.2),
        Path(("s1", "s3", "s4"), 0.15),
        Path(("s0", "s3", "s4"), 0.12),
        Path(("s1", "s3", "s5"), 0.3),
    )
    return Pipeline(steps, edges, paths, rate=100.0)


def test_transformation_removes_the_least_shared_edge_into_each_join_and_splits_by_intensity():
    pipeline = fig5_like_pipeline()
    assert sharing_degree(tuple(Segment(p.steps, p.sla_s) for p in pipeline.paths), ("s1", "s3")) == 2
    graph = transform(pipeline)
    # s3: (s0, s3) is on one path, (s1, s3) on two; then s4: (s2, s4) on one, (s3, s4) on two.
    assert set(pipeline.edges) - set(graph.edges) == {("s0", "s3"), ("s2", "s4")}
    work = {n: intensity(pipeline, n) for n in ("s0", "s1", "s2", "s3", "s4")}
    expected = {
        ("s1", "s2"): 0.2 * (work["s1"] + work["s2"]) / (work["s1"] + work["s2"] + work["s4"]),
        ("s4",): 0.2 * work["s4"] / (work["s1"] + work["s2"] + work["s4"]),
        ("s0",): 0.12 * work["s0"] / (work["s0"] + work["s3"] + work["s4"]),
        ("s3", "s4"): 0.12 * (work["s3"] + work["s4"]) / (work["s0"] + work["s3"] + work["s4"]),
        ("s1", "s3", "s4"): 0.15,
        ("s1", "s3", "s5"): 0.3,
    }
    assert {seg.steps: seg.sla_s for seg in graph.segments} == pytest.approx(expected)
    # Intensity: the mean processing time over the batch sizes in 1-16 (here 1, 2, 4, 8).
    assert work["s2"] == pytest.approx(sum(0.006 * b + 0.008 for b in (1, 2, 4, 8)) / 4)


def test_fa2_plan_on_the_transformed_graph_meets_every_original_path():
    pipeline = fig5_like_pipeline()
    plan = fa2_plan(pipeline)
    assert plan is not None and plan.feasible
    assert plan.cost >= brute_force_plan(pipeline).cost


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
