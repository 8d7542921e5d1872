"""Symphony's epoch partitioning (Section 4.7, Appendix A) at 256 and 1,024 GPUs, in ``gateway simulate``.

    .venv/bin/python benchmarks/symphony_partition.py [--quick] [--seeds 2] [--duration 5] [--jobs 2]
        [--zoos 1080ti,a100] [--max-rate-rps 30000] [--time-limit-s 10] [--shape 0.3]

The cluster grows as Symphony grows it: copies of the zoo ("ResNet50#3", a variant of its own
with its own weights), one copy per 64 GPUs (4 copies on 256 GPUs, 16 on 1,024), so the load
per model stays that of Section 5.3's 64-GPU runs. Per zoo and scale:

1. Partition (schedulers/partition.py): every model at its share of the cluster's upper bound
   (``upper_bound_rps``, the even split: the most this cluster could serve, so no dispatcher
   exceeds its capacity under any load the cluster passes) and its memory
   (benchmarks/data/model_sizes.csv: weights from the Keras Applications table or estimated,
   runtime memory estimated for the largest batch within the SLO); R_max, the requests/s one
   dispatcher core decides (``--max-rate-rps``), S_max one GPU's memory (11 GB for a 1080Ti,
   40 GB for an A100). The fewest sub-clusters the program can fill, their GPUs in proportion
   to their GPU demand, the greedy start's objective beside the solver's.
2. Goodput (Symphony's: the highest offered load at which every model's bad rate is within 1%,
   gateway/tools/goodput.py ``bisect_load`` and ``meets_slo``, each probe stopped as soon as a
   model is past 1%), without partitioning (one scheduler over every GPU and model: it ignores
   memory, every GPU holding every model, which S_max forbids; shown as the multiplexing
   ceiling) and with it (one independent simulation per sub-cluster over its models and GPUs;
   a load passes when every sub-cluster passes). Both see the same arrivals: ``zoo_arrivals``
   draws one stream per model name, in order, whatever the rates, so a sub-cluster's trace is
   the whole trace restricted to its models. At the goodput, each scheduler's requests decided
   per core-second and the cores its rate would take.
3. A new epoch: the per-model rates skewed (Zipf-like over a random order of the models, the
   total kept), re-partitioned under the disruption bound (11) with unit costs (a move costs an
   unload and a load: 2) and C_max = 2 x 5% of the models, beside C_max = 0 (nothing moves)
   and no bound at all; the models moved, the objective and the imbalance of each.
4. The solver beside its greedy start on Appendix A.2's kind of instance: random zoo variants,
   exponential rates, no capacity binding, the same time limit.

Writes benchmarks/work/symphony_partition.json and .md (``_quick`` with ``--quick``, ``_trial``
with other settings than the defaults) and prints the tables.

Run time on the project's 2-core machine (``--jobs 2``: the independent bisections in a pool of
two; a partitioned bisection runs its sub-clusters one after another and stops at the first that
fails, which keeps both cores busy without nesting pools): the defaults (both zoos, 2 seeds,
5 virtual s, a 1% bisection, 10 s solver limit) took 25 minutes (1,330 CPU-seconds) while
other work shared the machine, most of it the 1,024-GPU bisections of the A100 zoo (a passing
5 s run there is 1.5 million requests, about a minute); ``--quick`` (1 seed, 1 virtual s per
run, a 4% bisection, 2 s solver limit, one A.2 instance) about 2 minutes. The schedulers' requests
per core-second are read while the other job (and whatever else runs) shares the machine:
compare them within a run.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import random
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.tools.goodput import BAD_LIMIT, bisect_load, meets_slo, upper_bound_rps
from gateway.tools.simulate import ZooModel, even_split, load_zoo, simulate
from schedulers.gpu import DEFAULT_POLICY
from schedulers.partition import (
    Capacity,
    Disruption,
    InfeasiblePartition,
    ModelLoad,
    Partition,
    PartitionNotFound,
    fewest_subclusters,
    gpu_demand,
    greedy_partition,
    largest_batch_within_slo,
    partition_fewest,
    partition_models,
    split_gpus,
)

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
SIZES = HERE / "data" / "model_sizes.csv"
# zoo -> (profiles, S_max in MB: the GPU's memory, 11 GB on a GeForce 1080Ti, 40 GB on an A100 40GB)
ZOOS = {
    "1080ti": (DATA / "symphony_zoo_1080ti.csv", 11_000.0),
    "a100": (DATA / "symphony_zoo_a100.csv", 40_000.0),
}
# (GPUs, copies of the zoo): one copy per 64 GPUs, Section 5.3's cluster per copy.
SCALES = ((256, 4), (1024, 16))
# R_max: what one dispatcher core decides. One scheduler over the 560 models of 1,024 GPUs decided
# 16,000-55,000 requests per core-second on this machine (gateway simulate's scheduled_per_core_s,
# lower while other work shares it), one over 35 to 70 models 40,000-85,000: 30,000 keeps a
# sub-cluster within what one core sustains.
MAX_RATE_RPS = 30_000.0
SHAPE = 0.3  # the middle of Section 5.3's Gamma shapes (0.1, 0.3, 1.0)
TIME_LIMIT_S = 10.0  # Appendix A.1: Symphony's solver ran 10 s
TOLERANCE = 0.01  # bisection width, a share of the upper bound
DURATION_S = 5.0
SEEDS = 2
DEFAULT_ZOOS = "1080ti,a100"
# The new epoch: rate of the k-th model (in a random order) proportional to k^-ZIPF_EXPONENT.
ZIPF_EXPONENT = 0.5
MOVE_SHARE = 0.05  # C_max allows this share of the models to move (unit costs: 2 a move)
# Appendix A.2's kind of instance: (models, sub-clusters), exponential rates of this mean.
A2_INSTANCES = ((200, 5), (800, 20))
A2_MEAN_RATE_RPS = 100.0
A2_SEEDS = 3
QUICK = {"seeds": 1, "duration": 1.0, "tolerance": 0.04, "time_limit_s": 2.0, "a2_instances": ((200, 5),), "a2_seeds": 1}


# -- the models ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSize:
    static_mb: float
    activation_mb_per_item: float
    source: str


def load_sizes(path: Path = SIZES) -> dict[str, ModelSize]:
    """benchmarks/data/model_sizes.csv, whose header comment says where each figure comes from."""
    with path.open() as handle:
        rows = csv.DictReader(line for line in handle if not line.startswith("#"))
        return {
            row["model"]: ModelSize(float(row["static_mb"]), float(row["activation_mb_per_item"]), row["source"]) for row in rows
        }


def variants(zoo: Sequence[ZooModel], copies: int) -> list[ZooModel]:
    """``copies`` copies of every model of the zoo, named as Symphony names variants (``ResNet50#3``)."""
    return [ZooModel(f"{m.name}#{c}", m.per_item_ms, m.fixed_ms, m.slo_ms) for c in range(copies) for m in zoo]


def base_name(model: str) -> str:
    return model.split("#", 1)[0]


def model_loads(models: Sequence[ZooModel], rates: Mapping[str, float], sizes: Mapping[str, ModelSize]) -> list[ModelLoad]:
    """r_i, s_i and d_i: d_i = the estimated activations per item x the largest batch within the SLO."""
    loads = []
    for model in models:
        size = sizes[base_name(model.name)]
        batch = largest_batch_within_slo(model.per_item_ms, model.fixed_ms, model.slo_ms)
        loads.append(ModelLoad(model.name, rates[model.name], size.static_mb, size.activation_mb_per_item * batch))
    return loads


def demands(partition: Partition, models: Mapping[str, ZooModel], rates: Mapping[str, float]) -> list[float]:
    """Each sub-cluster's GPU demand: sum over its models of r x l(B) / B."""
    return [
        sum(gpu_demand(rates[n], models[n].per_item_ms, models[n].fixed_ms, models[n].slo_ms) for n in sub.models)
        for sub in partition.subclusters
    ]


def zipf_rates(names: Sequence[str], total_rps: float, exponent: float, rng: random.Random) -> dict[str, float]:
    """``total_rps`` over ``names`` in a random order, the k-th getting a share proportional to k^-exponent."""
    order = list(names)
    rng.shuffle(order)
    weights = {name: (k + 1) ** -exponent for k, name in enumerate(order)}
    scale = total_rps / sum(weights.values())
    return {name: weights[name] * scale for name in names}


# -- goodput ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    """A scheduler's share: its GPUs and its models (the whole cluster without partitioning)."""

    gpus: int
    models: tuple[ZooModel, ...]


@dataclass(frozen=True)
class Bisection:
    """One bisection, a unit of work for the pool."""

    zoo_name: str
    gpus: int
    mode: str  # "single" or "partitioned"
    seed: int
    models: tuple[ZooModel, ...]  # every model of the cluster, in the order the arrivals are drawn
    groups: tuple[Group, ...]
    shape: float | None
    duration_s: float
    tolerance: float


def run_groups(task: Bisection, load_rps: float) -> dict[str, Any]:
    """Every group at ``load_rps`` split evenly over all models, until one fails."""
    rates = even_split(task.models, load_rps)
    runs = []
    for group in task.groups:
        names = {m.name for m in group.models}
        # the full mapping, zero outside the group: the group's arrivals are the whole trace's
        group_rates = {name: rate if name in names else 0.0 for name, rate in rates.items()}
        started = time.perf_counter()
        result = simulate(
            list(group.models), group.gpus, group_rates, task.shape, DEFAULT_POLICY, task.duration_s, task.seed,
            stop_above_bad_rate=BAD_LIMIT,
        )  # fmt: skip
        runs.append(
            {
                "gpus": group.gpus,
                "models": len(group.models),
                "offered_rps": result["offered_rps"],
                "passes": meets_slo(result, BAD_LIMIT),
                "stopped_early": result["stopped_early"],
                "scheduled_per_core_s": result["scheduled_per_core_s"],
                "gpu_idle_fraction": result["gpu_idle_fraction"],
                "wall_s": time.perf_counter() - started,
            }
        )
        if not runs[-1]["passes"]:
            break
    return {"load_rps": load_rps, "passes": all(r["passes"] for r in runs) and len(runs) == len(task.groups), "groups": runs}


def bisect(task: Bisection) -> tuple[Bisection, float, list[dict[str, Any]]]:
    """The highest load at which every group passes, and every probe on the way."""
    probes: list[dict[str, Any]] = []

    def passes(load: float) -> bool:
        probes.append(run_groups(task, load))
        return probes[-1]["passes"]

    bound = upper_bound_rps(task.models, task.gpus)
    goodput = bisect_load(passes, bound / 2, bound, task.tolerance * bound)
    return task, goodput, probes


def pool_map(function: Callable[[Any], Any], tasks: Sequence[Any], jobs: int) -> Iterator[Any]:
    if jobs <= 1 or len(tasks) <= 1:
        yield from map(function, tasks)
        return
    with multiprocessing.Pool(min(jobs, len(tasks))) as pool:
        yield from pool.imap_unordered(function, tasks)


# -- partitioning ------------------------------------------------------------------------------------
def describe(partition: Partition, gpus: Sequence[int] | None, solve_s: float) -> dict[str, Any]:
    rate_imbalance, memory_imbalance = partition.imbalance()
    return {
        "subclusters": len(partition.subclusters),
        "method": partition.method,
        "objective": partition.objective,
        "greedy_objective": partition.greedy_objective,
        "solver_bound": partition.solver_bound,
        "solver_status": partition.solver_status,
        "memory_weight": partition.memory_weight,
        "rate_spread_rps": partition.rate_spread_rps,
        "memory_spread_mb": partition.memory_spread_mb,
        "rate_imbalance": rate_imbalance,
        "memory_imbalance": memory_imbalance,
        "moved": len(partition.moved),
        "disruption_cost": partition.disruption_cost,
        "solve_s": solve_s,
        "per_subcluster": [
            {
                "models": len(sub.models),
                "rate_rps": sub.rate_rps,
                "static_mb": sub.static_mb,
                "memory_mb": sub.memory_mb,
                **({"gpus": gpus[sub.index]} if gpus is not None else {}),
            }
            for sub in partition.subclusters
        ],
    }


def timed(function: Callable[[], Partition]) -> tuple[Partition, float]:
    started = time.perf_counter()
    partition = function()
    return partition, time.perf_counter() - started


def new_epoch(
    loads: Sequence[ModelLoad],
    first: Partition,
    models: Mapping[str, ZooModel],
    gpus: int,
    capacity: Capacity,
    time_limit_s: float,
    seed: int,
) -> dict[str, Any]:
    """Skewed rates at the same total, re-partitioned: staying put, under (11), and unbounded."""
    total = sum(m.rate_rps for m in loads)
    rates = zipf_rates([m.name for m in loads], total, ZIPF_EXPONENT, random.Random(f"epoch-{seed}"))
    skewed = [ModelLoad(m.name, rates[m.name], m.static_mb, m.dynamic_mb) for m in loads]
    count = len(first.subclusters)
    current = first.assignment()
    budget = 2 * math.ceil(MOVE_SHARE * len(loads))
    old_gpus = split_gpus(demands(first, models, {m.name: m.rate_rps for m in loads}), gpus)
    entry: dict[str, Any] = {
        "zipf_exponent": ZIPF_EXPONENT,
        "largest_rate_over_mean": max(rates.values()) / (total / len(loads)),
        "max_cost": budget,
        "runs": {},
    }
    for name, disruption in (
        ("stay (C_max = 0)", Disruption(current, 0.0)),
        (f"bounded (C_max = {budget})", Disruption(current, float(budget))),
        ("unbounded (no (11))", None),
    ):
        try:
            partition, solve_s = timed(
                lambda d=disruption: partition_models(skewed, count, capacity, disruption=d, time_limit_s=time_limit_s)
            )
        except (InfeasiblePartition, PartitionNotFound) as error:  # said in the table, the reason in the JSON
            entry["runs"][name] = {"error": str(error), "infeasible": isinstance(error, InfeasiblePartition)}
            continue
        new_gpus = split_gpus(demands(partition, models, rates), gpus)
        described = describe(partition, new_gpus, solve_s)
        if disruption is None:  # (11) was not imposed: count the moves all the same
            described["moved"] = sum(current[n] != j for n, j in partition.assignment().items())
            described["disruption_cost"] = 2 * described["moved"]
        described["gpus_moved"] = sum(max(0, a - b) for a, b in zip(new_gpus, old_gpus, strict=True))
        entry["runs"][name] = described
    return entry


def appendix_a2(instances: Sequence[tuple[int, int]], seeds: int, zoo: Sequence[ZooModel], sizes: Mapping[str, ModelSize],
                time_limit_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """Greedy and solver on random zoo variants with exponential rates (Appendix A.2's setting)."""
    rows = []
    for count_models, count_subclusters in instances:
        for seed in range(seeds):
            rng = random.Random(f"a2-{count_models}-{count_subclusters}-{seed}")
            chosen = [rng.choice(zoo) for _ in range(count_models)]
            loads = []
            for i, model in enumerate(chosen):
                size = sizes[model.name]
                batch = largest_batch_within_slo(model.per_item_ms, model.fixed_ms, model.slo_ms)
                loads.append(
                    ModelLoad(f"{model.name}#{i}", rng.expovariate(1 / A2_MEAN_RATE_RPS), size.static_mb,
                              size.activation_mb_per_item * batch)
                )  # fmt: skip
            capacity = Capacity(math.inf, math.inf)
            greedy = greedy_partition(loads, count_subclusters, capacity)
            partition, solve_s = timed(
                lambda loads=loads, count=count_subclusters: partition_models(
                    loads, count, Capacity(math.inf, math.inf), time_limit_s=time_limit_s
                )
            )
            rows.append(
                {
                    "models": count_models,
                    "subclusters": count_subclusters,
                    "seed": seed,
                    "greedy": {"objective": greedy.objective, "imbalance": greedy.imbalance()} if greedy else None,
                    "solver": describe(partition, None, solve_s),
                }
            )
    return rows


# -- the whole run --------------------------------------------------------------------------------------
def prepare(zoo_name: str, gpus: int, copies: int, args: argparse.Namespace, sizes: Mapping[str, ModelSize]) -> dict[str, Any]:
    """The partition of one scale, and the groups its bisections run."""
    path, memory_mb = ZOOS[zoo_name]
    models = variants(load_zoo(path), copies)
    by_name = {m.name: m for m in models}
    bound = upper_bound_rps(models, gpus)
    rates = even_split(models, bound)
    loads = model_loads(models, rates, sizes)
    capacity = Capacity(args.max_rate_rps, memory_mb)
    partition, solve_s = timed(lambda: partition_fewest(loads, capacity, time_limit_s=args.time_limit_s))
    split = split_gpus(demands(partition, by_name, rates), gpus)
    static_all = sum(m.static_mb for m in loads)
    single_memory = static_all + max(m.dynamic_mb for m in loads)
    return {
        "models": models,
        "loads": loads,
        "partition": partition,
        "groups": {
            "single": (Group(gpus, tuple(models)),),
            "partitioned": tuple(Group(split[sub.index], tuple(by_name[n] for n in sub.models)) for sub in partition.subclusters),
        },
        "report": {
            "zoo": zoo_name,
            "gpus": gpus,
            "copies": copies,
            "models": len(models),
            "upper_bound_rps": bound,
            "max_rate_rps": capacity.max_rate_rps,
            "max_memory_mb": capacity.max_memory_mb,
            "lower_bound_subclusters": fewest_subclusters(loads, capacity),
            "single_memory_mb": single_memory,
            "single_fits_memory": single_memory <= capacity.max_memory_mb,
            "partition": describe(partition, split, solve_s),
            "epoch": new_epoch(loads, partition, by_name, gpus, capacity, args.time_limit_s, copies),
        },
    }


def at_goodput(probes: Sequence[Mapping[str, Any]], goodput: float) -> Mapping[str, Any] | None:
    """The passing probe at the goodput (bisect_load returns a load it saw pass)."""
    for probe in probes:
        if probe["passes"] and math.isclose(probe["load_rps"], goodput, rel_tol=1e-12):
            return probe
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 1 virtual s per run, a 4%% bisection, a 2 s solver limit")
    parser.add_argument("--zoos", default=DEFAULT_ZOOS, help=f"comma-separated, of {', '.join(ZOOS)}")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="seeds per point: a bisection each")
    parser.add_argument("--duration", type=float, default=DURATION_S, help="virtual seconds per run")
    parser.add_argument("--shape", type=float, default=SHAPE, help="Gamma shape of the arrival gaps")
    parser.add_argument("--max-rate-rps", type=float, default=MAX_RATE_RPS, help="R_max: requests/s one dispatcher decides")
    parser.add_argument("--time-limit-s", type=float, default=TIME_LIMIT_S, help="the solver's time limit per partitioning")
    parser.add_argument("--jobs", type=int, default=2, help="processes for the independent bisections")
    parser.add_argument("--output-dir", type=Path, default=HERE / "work")
    args = parser.parse_args(argv)
    zoo_names = args.zoos.split(",")
    unknown = [z for z in zoo_names if z not in ZOOS]
    if unknown:
        parser.error(f"unknown zoo {', '.join(unknown)} (known: {', '.join(ZOOS)})")
    tolerance, a2_instances, a2_seeds = TOLERANCE, A2_INSTANCES, A2_SEEDS
    full = not args.quick and (args.seeds, args.duration, args.shape, args.max_rate_rps, args.time_limit_s, zoo_names) == (
        SEEDS, DURATION_S, SHAPE, MAX_RATE_RPS, TIME_LIMIT_S, DEFAULT_ZOOS.split(",")
    )  # fmt: skip
    stem = "symphony_partition" if full else "symphony_partition_quick" if args.quick else "symphony_partition_trial"
    if args.quick:
        args.seeds, args.duration, args.time_limit_s = QUICK["seeds"], QUICK["duration"], QUICK["time_limit_s"]
        tolerance, a2_instances, a2_seeds = QUICK["tolerance"], QUICK["a2_instances"], QUICK["a2_seeds"]
    started = time.perf_counter()

    def progress(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {line}", flush=True)

    sizes = load_sizes()
    scales: dict[str, dict[str, Any]] = {}
    tasks = []
    for zoo_name in zoo_names:
        for gpus, copies in SCALES:
            prepared = prepare(zoo_name, gpus, copies, args, sizes)
            key = f"{zoo_name}/{gpus}"
            scales[key] = prepared["report"]
            part = prepared["report"]["partition"]
            progress(f"{key}: {part['subclusters']} sub-clusters by {part['method']} in {part['solve_s']:.1f} s, "
                     f"GPUs {[s['gpus'] for s in part['per_subcluster']]}")  # fmt: skip
            for mode, groups in prepared["groups"].items():
                for seed in range(args.seeds):
                    tasks.append(
                        Bisection(
                            zoo_name, gpus, mode, seed, tuple(prepared["models"]), groups, args.shape, args.duration, tolerance
                        )
                    )
    tasks.sort(key=lambda t: -t.gpus)  # the longest first: the pool ends together
    for task, goodput, probes in pool_map(bisect, tasks, args.jobs):
        key = f"{task.zoo_name}/{task.gpus}"
        peak = at_goodput(probes, goodput)
        entry = scales[key].setdefault("goodput", {}).setdefault(task.mode, {"per_seed": {}, "at_goodput": {}, "probes": {}})
        entry["per_seed"][str(task.seed)] = goodput
        entry["at_goodput"][str(task.seed)] = peak
        entry["probes"][str(task.seed)] = probes
        progress(f"{key} {task.mode} seed {task.seed}: goodput {goodput:.0f} req/s ({len(probes)} probes, "
                 f"{sum(g['wall_s'] for p in probes for g in p['groups']):.0f} s)")  # fmt: skip
    report = {
        "policy": DEFAULT_POLICY,
        "shape": args.shape,
        "duration_s": args.duration,
        "tolerance": tolerance,
        "seeds": args.seeds,
        "bad_limit": BAD_LIMIT,
        "time_limit_s": args.time_limit_s,
        "scales": scales,
    }
    report["appendix_a2"] = appendix_a2(a2_instances, a2_seeds, load_zoo(ZOOS[zoo_names[0]][0]), sizes, args.time_limit_s)
    progress("Appendix A.2 instances done")
    report["wall_s"] = time.perf_counter() - started
    command = " ".join(["benchmarks/symphony_partition.py", *(sys.argv[1:] if argv is None else argv)])
    text = markdown(report, command, args.jobs)
    print("\n" + text)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (args.output_dir / f"{stem}.md").write_text(text)
    print(f"\nwrote {args.output_dir / stem}.json and .md ({report['wall_s']:.0f} s)")
    return 0


# -- tables ---------------------------------------------------------------------------------------------
def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def markdown(report: Mapping[str, Any], command: str, jobs: int) -> str:
    lines = [
        "# Symphony's epoch partitioning (Section 4.7, Appendix A) at scale",
        "",
        f"`.venv/bin/python {command}`: policy {report['policy']}, Gamma shape {report['shape']:g}, {report['seeds']} "
        f"seed(s), {report['duration_s']:g} virtual s per run, bisection to {report['tolerance']:.0%} of the upper "
        f"bound, solver limit {report['time_limit_s']:g} s; {report['wall_s'] / 60:.1f} min with {jobs} jobs.",
        "",
        "Goodput: the highest offered load at which every model's bad rate is within 1% (p99 within its SLO). "
        "Single: one scheduler over every GPU and model (every GPU holding every model; see the memory column). "
        "Partitioned: one scheduler per sub-cluster over its models and GPUs; a load passes when all pass.",
        "",
        "| zoo | GPUs | models | upper bound (req/s) | single goodput | partitioned goodput | partitioned / single "
        "| sub-clusters (lower bound) | GPUs per sub-cluster | memory per GPU, single (MB) | largest per GPU, partitioned (MB) "
        "| S_max (MB) |",
        "|---" * 12 + "|",
    ]
    for scale in report["scales"].values():
        goodput = scale.get("goodput", {})
        single = _mean(list(goodput.get("single", {}).get("per_seed", {}).values()))
        parted = _mean(list(goodput.get("partitioned", {}).get("per_seed", {}).values()))
        part = scale["partition"]
        gpus = sorted({s["gpus"] for s in part["per_subcluster"]})
        lines.append(
            f"| {scale['zoo']} | {scale['gpus']} | {scale['models']} | {scale['upper_bound_rps']:.0f} | {single:.0f} | "
            f"{parted:.0f} | {parted / single if single else 0:.3f} | "
            f"{part['subclusters']} ({scale['lower_bound_subclusters']}) | "
            f"{', '.join(map(str, gpus))} | {scale['single_memory_mb']:.0f} | "
            f"{max(s['memory_mb'] for s in part['per_subcluster']):.0f} | {scale['max_memory_mb']:.0f} |"
        )
    lines += [
        "",
        "Scheduler throughput at the goodput (mean over seeds): requests decided per core-second, the rate the "
        "scheduler must decide, and the cores that takes (rate / throughput).",
        "",
        "| zoo | GPUs | scheduler | models | GPUs | rate (req/s) | decided per core-s | cores needed |",
        "|---" * 8 + "|",
    ]
    for scale in report["scales"].values():
        for mode in ("single", "partitioned"):
            entry = scale.get("goodput", {}).get(mode, {"at_goodput": {}})
            peaks = [p for p in entry["at_goodput"].values() if p]
            if not peaks:
                continue
            for index in range(len(peaks[0]["groups"])):
                groups = [p["groups"][index] for p in peaks]
                rate = _mean([g["offered_rps"] for g in groups])
                per_core = _mean([g["scheduled_per_core_s"] for g in groups])
                name = "single" if mode == "single" else f"sub-cluster {index}"
                lines.append(
                    f"| {scale['zoo']} | {scale['gpus']} | {name} | {groups[0]['models']} | {groups[0]['gpus']} | "
                    f"{rate:.0f} | {per_core:.0f} | {rate / per_core if per_core else 0:.2f} |"
                )
    lines += [
        "",
        "Partitioning at the upper bound's even split: the solver beside its greedy start (objective (4) = dR + w dS, "
        "w = R_bar / S_bar), Appendix A.2's imbalance factors (max - min) / mean.",
        "",
        "| zoo | GPUs | sub-clusters | method | objective | greedy objective | rate imbalance | memory imbalance "
        "| rate per sub-cluster (req/s) | solve s |",
        "|---" * 10 + "|",
    ]
    for scale in report["scales"].values():
        part = scale["partition"]
        rates = [s["rate_rps"] for s in part["per_subcluster"]]
        lines.append(
            f"| {scale['zoo']} | {scale['gpus']} | {part['subclusters']} | {part['method']} | {_cell(part['objective'])} | "
            f"{_cell(part['greedy_objective'])} | {part['rate_imbalance']:.4f} | {part['memory_imbalance']:.4f} | "
            f"{min(rates):.0f}-{max(rates):.0f} | {part['solve_s']:.1f} |"
        )
    lines += [
        "",
        f"A new epoch: rates skewed (Zipf exponent {ZIPF_EXPONENT:g} over a random order, the total kept), "
        "re-partitioned over the same sub-clusters. Moved: models whose sub-cluster changed; GPUs moved: GPUs that "
        "change sub-cluster with the demand-proportional split. Every run has the same solver time limit: the "
        "unbounded program searches a far larger space and may end worse than the bounded one.",
        "",
        "| zoo | GPUs | largest rate / mean | run | method | moved models | cost (11) | objective | greedy objective "
        "| rate imbalance | GPUs moved |",
        "|---" * 11 + "|",
    ]
    for scale in report["scales"].values():
        epoch = scale["epoch"]
        for name, run in epoch["runs"].items():
            prefix = f"| {scale['zoo']} | {scale['gpus']} | {epoch['largest_rate_over_mean']:.1f} | {name} |"
            if "error" in run:
                lines.append(f"{prefix} {'infeasible' if run['infeasible'] else 'not found in time'} |" + " - |" * 6)
                continue
            lines.append(
                f"{prefix} {run['method']} | {run['moved']} | {run['disruption_cost']:.0f} | {run['objective']:.1f} | "
                f"{_cell(run['greedy_objective'])} | {run['rate_imbalance']:.4f} | {run['gpus_moved']} |"
            )
    lines += [
        "",
        "Appendix A.2's kind of instance (random zoo variants, exponential rates of mean "
        f"{A2_MEAN_RATE_RPS:g} req/s, no binding capacity): the greedy start and the solver's answer.",
        "",
        "| models | sub-clusters | seed | greedy objective | solver objective | method | greedy imbalance (rate, memory) "
        "| solver imbalance (rate, memory) | solve s |",
        "|---" * 9 + "|",
    ]
    for row in report["appendix_a2"]:
        greedy, solver = row["greedy"], row["solver"]
        lines.append(
            f"| {row['models']} | {row['subclusters']} | {row['seed']} | {_cell(greedy and greedy['objective'])} | "
            f"{solver['objective']:.3g} | {solver['method']} | "
            f"{_pair(greedy['imbalance']) if greedy else '-'} | "
            f"{solver['rate_imbalance']:.4f}, {solver['memory_imbalance']:.4f} | {solver['solve_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _pair(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.4f}" for v in values)


def _cell(value: float | None) -> str:
    if value is None:
        return "-"
    return "0" if abs(value) < 1e-6 else f"{value:.3g}"  # float sums of equal shares leave ~1e-10


if __name__ == "__main__":
    sys.exit(main())
