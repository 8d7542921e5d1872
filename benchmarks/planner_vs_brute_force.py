"""The cost planner against the exhaustive search on random pipelines of 5-8 steps (fixed seeds).

For each graph (planner/synthetic.py: CPU 2- and 4-core executors and a GPU per step, joins with
probability 0.3, per-path SLAs): the optimum (brute_force_plan), our plan_pipeline, and the
baselines (FA2 alone, Harpagon alone, even split). Reports the share of exact matches, the cost
ratio to the optimum (mean, worst) and the runtime of each. Harpagon plans in its own model
(d + b / w, fractional machines); its cost here pays each partial machine whole.

    .venv/bin/python benchmarks/planner_vs_brute_force.py --graphs 400
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import brute_force_plan, even_split_plan, fa2_plan, harpagon_plan, plan_pipeline  # noqa: E402
from planner.plan import joins  # noqa: E402
from planner.synthetic import random_pipeline  # noqa: E402


def timed(function, pipeline):
    start = time.perf_counter()
    result = function(pipeline)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    planners = {
        "ours (plan_pipeline)": lambda p: plan_pipeline(p),
        "FA2 alone": lambda p: fa2_plan(p),
        "Harpagon alone": lambda p: harpagon_plan(p),
        "even split": lambda p: even_split_plan(p),
    }
    rows = {name: {"found": 0, "exact": 0, "ratios": [], "seconds": [], "misses": []} for name in planners}
    brute_seconds: list[float] = []
    feasible = with_joins = 0
    for index in range(args.graphs):
        rng = random.Random(args.seed * 100_003 + index)
        pipeline = random_pipeline(rng, rng.randint(5, 8))
        optimum, seconds = timed(brute_force_plan, pipeline)
        brute_seconds.append(seconds)
        if optimum is None:
            continue
        feasible += 1
        with_joins += bool(joins(pipeline))
        for name, function in planners.items():
            plan, seconds = timed(function, pipeline)
            row = rows[name]
            row["seconds"].append(seconds)
            if plan is None:
                continue
            cost = plan.whole_machine_cost if name == "Harpagon alone" else plan.cost
            row["found"] += 1
            ratio = cost / optimum.cost
            row["ratios"].append(ratio)
            if abs(cost - optimum.cost) < 1e-9:
                row["exact"] += 1
            elif ratio > 1:
                row["misses"].append((index, len(pipeline.steps), bool(joins(pipeline)), ratio))
    print(f"graphs: {args.graphs}, feasible: {feasible} ({with_joins} with a join); seed {args.seed}")
    print(f"brute force: mean {statistics.mean(brute_seconds) * 1e3:.1f} ms, max {max(brute_seconds) * 1e3:.1f} ms per graph")
    print("| planner | plan found | exact optimum | cost / optimum mean | worst | runtime mean | max |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        ratios = row["ratios"] or [float("nan")]
        print(
            f"| {name} | {row['found']}/{feasible} | {row['exact']}/{feasible} ({100 * row['exact'] / feasible:.1f}%) "
            f"| {statistics.mean(ratios):.3f} | {max(ratios):.3f} "
            f"| {statistics.mean(row['seconds']) * 1e3:.1f} ms | {max(row['seconds']) * 1e3:.1f} ms |"
        )
    ours = rows["ours (plan_pipeline)"]["misses"]
    print(f"ours, misses (graph, steps, has join, ratio): {[(i, n, j, round(r, 3)) for i, n, j, r in ours]}")


if __name__ == "__main__":
    main()
