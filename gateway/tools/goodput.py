"""Symphony's goodput, measured with ``gateway simulate`` (``--zoo CSV --goodput``).

Goodput (Symphony Sections 2 and 5.3) is the highest aggregate offered load at which EVERY
model's p99 latency is within its SLO: every model's bad rate (late, refused, dropped, left
over, timed out: anything not answered within its SLO, over its arrivals) is at most 1%. A
model with no arrivals passes. A policy that wins by starving some models has not won
(../shared/DESIGN.md).

How it is measured here, per zoo, Gamma shape, policy and seed:

1. the bracket starts from ``upper_bound_rps``: every model running its largest batch that fits
   its SLO on every GPU-second, the load split evenly;
2. ``bisect_load`` finds the highest load that passes ``meets_slo``; a probe stops as soon as
   one model has more bad requests than 1% of its arrivals allow (they are generated up front,
   so the count is known), a probe that passes always runs to the end;
3. at the policy's own peak p (the mean over seeds) the flat-top table above it (1.25x, 1.5x,
   2x p: in-SLO throughput over p, the worst model's and the overall bad rate), the GPU idle
   fraction under it (0.25x to 1x p) beside Symphony's ideal (p - o) / p, and the autoscaling
   signals (Section 4.4, schedulers/autoscale.py) at each of those points.

The independent runs (bisections, then the points) go to a pool of processes (``jobs``).
"""

from __future__ import annotations

import math
import multiprocessing
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gateway.tools.simulate import ZooModel, bad_allowance, even_split, simulate, zoo_arrivals
from schedulers.autoscale import scaling_signal

__all__ = [
    "BAD_LIMIT",
    "FLAT_TOP_MULTIPLES",
    "IDLE_MULTIPLES",
    "GoodputUnmeasurable",
    "NoEdgeFound",
    "bisect_load",
    "even_split",
    "markdown",
    "measure",
    "meets_slo",
    "shape_name",
    "summary_table",
    "upper_bound_rps",
    "worst_models",
    "zoo_arrivals",
    "zoo_goodput",
]

# Symphony Section 2: p99 within the SLO, so at most 1% of a model's requests may end badly.
BAD_LIMIT = 0.01
# The bisection stops when its bracket is narrower than this share of the zoo's upper bound
# (about 90 requests/s for the 1080Ti zoo on 64 GPUs).
TOLERANCE = 0.01
# Symphony's flat-top figure (Section 4.4) runs the load past the peak; its idle-fraction
# argument (the cluster idles (p - o) / p at a load o under the peak) is checked below it.
FLAT_TOP_MULTIPLES = (1.25, 1.5, 2.0)
IDLE_MULTIPLES = (0.25, 0.5, 0.75, 1.0)
# A predicate that still passes after this many doublings of the load has no edge to find.
MAX_WIDENINGS = 30
# Goodput's bisection starts at the zoo's upper bound, which no steady load can pass by more
# than the 1% that p99 forgives; a load that passes at 4x it passed only because the run ended
# before any request could miss its SLO (an SLO near or over the run's length).
BOUND_WIDENINGS = 2


# A bisection runs a dozen simulations near the zoo's upper bound: past this many requests in
# one (the bound times the run's length) it would run for hours, or exhaust the memory.
MAX_REQUESTS_A_RUN = 20_000_000


class GoodputUnmeasurable(RuntimeError):
    """The goodput of this zoo cannot be measured in runs of this length."""


class NoEdgeFound(GoodputUnmeasurable):
    """Every load tried passed: the bisection has no edge to find."""


# -- what passes ------------------------------------------------------------------------------
def meets_slo(result: Mapping[str, Any], bad_limit: float = BAD_LIMIT) -> bool:
    """Every model's bad rate (arrivals not answered within the SLO, over its arrivals) is at most
    ``bad_limit``: a run's verdict by Symphony's goodput, judged per model, never overall."""
    for counts in result["models"].values():
        arrived = counts.get("arrived", 0)
        if arrived - counts.get("in_slo", 0) > bad_allowance(arrived, bad_limit):
            return False
    return True


def worst_models(result: Mapping[str, Any], n: int = 3) -> list[tuple[str, float]]:
    """The ``n`` models with the highest bad rate, worst first: [(model, bad rate)]."""
    rates = [(name, _bad_rate(counts)) for name, counts in result["models"].items()]
    return sorted(rates, key=lambda item: -item[1])[:n]


def _bad_rate(counts: Mapping[str, int]) -> float:
    arrived = counts.get("arrived", 0)
    return (arrived - counts.get("in_slo", 0)) / arrived if arrived else 0.0


# -- where to look ----------------------------------------------------------------------------
def upper_bound_rps(zoo: Sequence[ZooModel], gpus: int, slo_fraction: float = 1.0) -> float:
    """The even-split load that fills ``gpus`` GPUs with every model at its most efficient batch.

    A model m runs at best batches of B = floor((slo_fraction x SLO - beta) / alpha), the
    largest whose l(B) = alpha B + beta fits the SLO (no request can be in a larger batch and
    still be answered in time); at r requests/s it then takes r (alpha B + beta) / B
    GPU-seconds per second. With r = T / M for each of the M models, T solves
    sum_m T / M x (alpha_m + beta_m / B_m) = gpus. ``slo_fraction`` 0.5 leaves half the SLO
    to waiting (a batch forms while the previous one runs). 0 when some model cannot answer
    even alone within the SLO: no load then meets every model's SLO.
    """
    ms_per_request = 0.0
    for model in zoo:
        # At most 2**53 (a float's whole numbers): a tiny alpha against a long SLO overflowed floor().
        batch = math.floor(min((slo_fraction * model.slo_ms - model.fixed_ms) / model.per_item_ms, 2.0**53))
        if batch < 1:
            return 0.0
        ms_per_request += model.per_item_ms + model.fixed_ms / batch
    return gpus * 1000 * len(zoo) / ms_per_request


def bisect_load(
    passes: Callable[[float], bool], low: float, high: float, tolerance: float, max_widenings: int = MAX_WIDENINGS
) -> float:
    """The highest load that ``passes``, to within ``tolerance`` (in the load's units).

    Assumes that a load that passes has every lower load pass. The bracket is repaired first:
    while ``high`` passes, it doubles (the old ``high`` becomes ``low``); while ``low`` fails,
    it halves (the old ``low`` becomes ``high``), and once it is under ``tolerance`` the answer
    is 0. Then the usual bisection keeps ``low`` passing and ``high`` failing until they are
    within ``tolerance``, and returns ``low``: a load that was seen to pass. NoEdgeFound when
    ``high`` still passes after ``max_widenings`` doublings.
    """
    if not 0 < low < high or tolerance <= 0:
        raise ValueError(f"bisect_load needs 0 < low < high and tolerance > 0, got {low}, {high}, {tolerance}")
    low_passes = False
    for _ in range(max_widenings + 1):
        if not passes(high):
            break
        low, high, low_passes = high, 2 * high, True
    else:
        raise NoEdgeFound(f"every load up to {high / 2:g} passes: no edge to find")
    while not low_passes and not passes(low):
        low, high = low / 2, low
        if low < tolerance:
            return 0.0
    while high - low > tolerance:
        middle = (low + high) / 2
        if passes(middle):
            low = middle
        else:
            high = middle
    return low


# -- the runs ---------------------------------------------------------------------------------
def shape_name(shape: float | None) -> str:
    return "poisson" if shape is None else f"{shape:g}"


@dataclass(frozen=True, kw_only=True)
class _Setting:
    """What a simulation runs, but for its load: the unit of work for the pool is one of these."""

    zoo_name: str
    zoo: tuple[ZooModel, ...]
    gpus: int
    shape: float | None
    policy: str
    duration_s: float
    seed: int
    dispatch_delay_ms: float

    def simulate_at(self, load: float, stop_above_bad_rate: float | None = None) -> dict[str, Any]:
        return simulate(
            list(self.zoo), self.gpus, load, self.shape, self.policy, self.duration_s, self.seed,
            stop_above_bad_rate=stop_above_bad_rate, dispatch_delay_ms=self.dispatch_delay_ms,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class _Bisection(_Setting):
    """One seed's bisection."""

    tolerance: float
    bad_limit: float


@dataclass(frozen=True, kw_only=True)
class _Point(_Setting):
    """One run at ``multiple`` x the policy's peak."""

    multiple: float
    offered_rps: float


def _summary(result: Mapping[str, Any], duration_s: float, with_models: bool) -> dict[str, Any]:
    """What the report keeps of a run: its figures and, where asked, per model its outcome counts."""
    worst = worst_models(result, 1)
    summary = {
        "offered_rps": result["offered_rps"],
        "passes": meets_slo(result),
        "in_slo_rps": sum(m.get("in_slo", 0) for m in result["models"].values()) / duration_s,
        "bad_rate": result["bad_rate"],
        "worst_model": worst[0][0] if worst else None,
        "worst_bad_rate": worst[0][1] if worst else 0.0,
        "gpu_idle_fraction": result["gpu_idle_fraction"],
        "batch_mean": result["batch_mean"],
        "scheduled_per_core_s": result["scheduled_per_core_s"],
        "late_actions": result["late_actions"],
        "stopped_early": result["stopped_early"],
        "stopped_at_s": result["stopped_at_s"],
    }
    if with_models:
        summary["models"] = {name: {k: v for k, v in m.items() if k != "served_on"} for name, m in result["models"].items()}
    return summary


def _bisect(task: _Bisection) -> tuple[_Bisection, float, list[dict[str, Any]]]:
    """One seed: the highest passing load, and every probe on the way (load, verdict, worst model)."""
    probes: list[dict[str, Any]] = []

    def passes(load: float) -> bool:
        result = task.simulate_at(load, stop_above_bad_rate=task.bad_limit)
        probes.append(_summary(result, task.duration_s, with_models=False))
        return meets_slo(result, task.bad_limit)

    bound = upper_bound_rps(task.zoo, task.gpus)
    if bound == 0:
        return task, 0.0, probes
    if bound * task.duration_s > MAX_REQUESTS_A_RUN:
        raise GoodputUnmeasurable(
            f"the zoo's upper bound of {bound:g} requests/s is {bound * task.duration_s:g} requests a run of "
            f"{task.duration_s:g} s, over the {MAX_REQUESTS_A_RUN:,} a run that a bisection can afford: "
            "give fewer GPUs, a shorter --duration, or models whose alpha is not so small against their SLO"
        )
    # The bound is seldom reached (requests wait, bursts come): start the bracket under it.
    try:
        goodput = bisect_load(passes, bound / 2, bound, task.tolerance * bound, BOUND_WIDENINGS)
    except NoEdgeFound:
        slo_ms = max(model.slo_ms for model in task.zoo)
        raise NoEdgeFound(
            f"{task.policy} met every SLO at {2**BOUND_WIDENINGS}x the zoo's upper bound ({bound:g} requests/s), "
            f"which no steady load passes: a run of {task.duration_s:g} s ends before requests can miss "
            f"SLOs of up to {slo_ms:g} ms; run longer (--duration) or give SLOs under the run's length"
        ) from None
    return task, goodput, probes


def _run_point(task: _Point) -> tuple[_Point, dict[str, Any]]:
    return task, _summary(task.simulate_at(task.offered_rps), task.duration_s, with_models=True)


def _map(function: Callable[[Any], Any], tasks: Sequence[Any], jobs: int) -> Iterator[Any]:
    """``function`` over ``tasks``, in a pool of ``jobs`` processes when more than one, as they end."""
    if jobs <= 1 or len(tasks) <= 1:
        yield from map(function, tasks)
        return
    with multiprocessing.Pool(min(jobs, len(tasks))) as pool:
        yield from pool.imap_unordered(function, tasks)


def zoo_goodput(
    zoo: Sequence[ZooModel],
    gpus: int,
    shape: float | None,
    policy: str,
    duration_s: float,
    seeds: Iterable[int],
    *,
    tolerance: float = TOLERANCE,
    bad_limit: float = BAD_LIMIT,
    dispatch_delay_ms: float = 0.0,
    jobs: int = 1,
) -> dict[str, Any]:
    """Symphony's goodput of ``policy`` on ``zoo``: a bisection per seed (the seeds in a pool of
    ``jobs`` processes); each seed's goodput, their mean and their minimum, in requests/s.
    ``tolerance`` is a share of ``upper_bound_rps``."""
    tasks = [
        _Bisection(
            zoo_name="zoo",
            zoo=tuple(zoo),
            gpus=gpus,
            shape=shape,
            policy=policy,
            duration_s=duration_s,
            seed=seed,
            dispatch_delay_ms=dispatch_delay_ms,
            tolerance=tolerance,
            bad_limit=bad_limit,
        )
        for seed in seeds
    ]
    found = {task.seed: (goodput, probes) for task, goodput, probes in _map(_bisect, tasks, jobs)}
    per_seed = {seed: found[seed][0] for seed in sorted(found)}
    return {
        "per_seed": per_seed,
        "mean": statistics.fmean(per_seed.values()),
        "min": min(per_seed.values()),
        "probes": {seed: found[seed][1] for seed in sorted(found)},
    }


def measure(
    zoos: Mapping[str, Sequence[ZooModel]],
    *,
    gpus: int,
    shapes: Sequence[float | None],
    policies: Sequence[str],
    seeds: Sequence[int],
    duration_s: float,
    tolerance: float = TOLERANCE,
    bad_limit: float = BAD_LIMIT,
    dispatch_delay_ms: float = 0.0,
    jobs: int = 1,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The whole table: per zoo, shape and policy the goodput (a bisection per seed), then the runs
    at multiples of that peak (flat-top, idle fraction, autoscaling signals), every run of a
    phase in one pool. Returns a JSON-ready report (``markdown`` renders it)."""
    bisections = [
        _Bisection(
            zoo_name=name,
            zoo=tuple(zoo),
            gpus=gpus,
            shape=shape,
            policy=policy,
            duration_s=duration_s,
            seed=seed,
            dispatch_delay_ms=dispatch_delay_ms,
            tolerance=tolerance,
            bad_limit=bad_limit,
        )
        for name, zoo in zoos.items()
        for shape in shapes
        for policy in policies
        for seed in seeds
    ]
    bisections.sort(key=lambda t: -upper_bound_rps(t.zoo, t.gpus))  # the longest first: the pool ends together
    goodputs: dict[tuple[str, str, str], dict[int, float]] = {}
    probes: dict[tuple[str, str, str], dict[int, list[dict[str, Any]]]] = {}
    for task, goodput, seen in _map(_bisect, bisections, jobs):
        key = (task.zoo_name, shape_name(task.shape), task.policy)
        goodputs.setdefault(key, {})[task.seed] = goodput
        probes.setdefault(key, {})[task.seed] = seen
        progress(f"{task.zoo_name} shape {shape_name(task.shape)} {task.policy} seed {task.seed}: "
                 f"goodput {goodput:.0f} req/s ({len(seen)} runs)")  # fmt: skip

    points = [
        _Point(
            zoo_name=name,
            zoo=tuple(zoo),
            gpus=gpus,
            shape=shape,
            policy=policy,
            duration_s=duration_s,
            seed=seed,
            dispatch_delay_ms=dispatch_delay_ms,
            multiple=multiple,
            offered_rps=multiple * peak,
        )
        for name, zoo in zoos.items()
        for shape in shapes
        for policy in policies
        if (peak := statistics.fmean(goodputs[(name, shape_name(shape), policy)].values())) > 0
        for multiple in sorted({*IDLE_MULTIPLES, *FLAT_TOP_MULTIPLES})
        for seed in seeds
    ]
    points.sort(key=lambda t: -t.offered_rps)
    runs: dict[tuple[str, str, str], dict[float, dict[int, dict[str, Any]]]] = {}
    for task, summary in _map(_run_point, points, jobs):
        key = (task.zoo_name, shape_name(task.shape), task.policy)
        runs.setdefault(key, {}).setdefault(task.multiple, {})[task.seed] = summary
    progress(f"{len(points)} runs at multiples of each peak done")

    report: dict[str, Any] = {
        "gpus": gpus,
        "duration_s": duration_s,
        "seeds": list(seeds),
        "bad_limit": bad_limit,
        "tolerance": tolerance,
        "dispatch_delay_ms": dispatch_delay_ms,
        "policies": list(policies),
        "zoos": {},
    }
    for name, zoo in zoos.items():
        entry = report["zoos"][name] = {
            "models": len(zoo),
            "upper_bound_rps": upper_bound_rps(zoo, gpus),
            "upper_bound_half_slo_rps": upper_bound_rps(zoo, gpus, slo_fraction=0.5),
            "shapes": {},
        }
        for shape in shapes:
            by_policy = entry["shapes"][shape_name(shape)] = {}
            for policy in policies:
                key = (name, shape_name(shape), policy)
                by_policy[policy] = _policy_entry(goodputs[key], probes[key], runs.get(key, {}), gpus, entry["upper_bound_rps"])
    return report


def _policy_entry(
    per_seed: Mapping[int, float],
    probes: Mapping[int, list[dict[str, Any]]],
    runs: Mapping[float, Mapping[int, dict[str, Any]]],
    gpus: int,
    upper_bound: float,
) -> dict[str, Any]:
    peak = statistics.fmean(per_seed.values())
    points = {}
    for multiple in sorted(runs):
        seeds = [runs[multiple][seed] for seed in sorted(runs[multiple])]
        mean = {
            field: statistics.fmean(run[field] for run in seeds)
            for field in ("in_slo_rps", "bad_rate", "worst_bad_rate", "gpu_idle_fraction", "scheduled_per_core_s", "batch_mean")
        }
        signal = scaling_signal(gpus, mean["bad_rate"], mean["gpu_idle_fraction"])
        points[f"{multiple:g}"] = {
            "multiple": multiple,
            "offered_rps": multiple * peak,
            "mean": {**mean, "in_slo_over_peak": mean["in_slo_rps"] / peak},
            # Symphony's flat top: goodput stays at p past the peak, so (o - p) / o is bad;
            # under the peak the cluster idles (p - o) / p, and the signals read those back.
            "ideal": {
                "in_slo_over_peak": min(multiple, 1.0),
                "bad_rate": max(0.0, 1 - 1 / multiple),
                "gpu_idle_fraction": max(0.0, 1 - multiple),
                "gpus_to_add": gpus * max(0.0, multiple - 1),
                "gpus_to_release": gpus * max(0.0, 1 - multiple),
            },
            "signal": asdict(signal),
            "runs": {str(seed): run for seed, run in zip(sorted(runs[multiple]), seeds, strict=True)},
        }
    return {
        "goodput": {
            "per_seed": {str(seed): g for seed, g in sorted(per_seed.items())},
            "mean": peak,
            "min": min(per_seed.values()),
            "over_upper_bound": peak / upper_bound if upper_bound else 0.0,
        },
        "bisection": {str(seed): seen for seed, seen in sorted(probes.items())},
        "points": points,
    }


# -- tables -----------------------------------------------------------------------------------
def _cell(value: float, digits: int = 3) -> str:
    return "inf" if value == math.inf else f"{value:.{digits}f}"


def markdown(report: Mapping[str, Any], default: str | None = None, baselines: Sequence[str] = (), worst: int = 3) -> str:
    """The report as Markdown tables: per zoo and shape, goodput, flat-top, idle and signals,
    and the worst models at the peak. With ``default`` and ``baselines``, the ratios of the
    default's goodput to the best baseline's (the default itself left out of the baselines),
    where the default was measured."""
    lines: list[str] = []
    gpus = report["gpus"]
    if default is not None and default in report["policies"]:  # not measured: no ratios to give (no empty table)
        lines += [*summary_table(report, default, baselines), ""]
    for zoo_name, zoo in report["zoos"].items():
        half = zoo["upper_bound_half_slo_rps"]
        half_text = f"{half:.0f} req/s" if half else "none: some model's l(1) exceeds half its SLO"
        lines += [
            f"## {zoo_name}: {zoo['models']} models, {gpus} GPUs",
            "",
            f"Upper bound (every model at its largest batch within its SLO): {zoo['upper_bound_rps']:.0f} req/s "
            f"(with half the SLO: {half_text}).",
            "",
        ]
        for shape, policies in zoo["shapes"].items():
            lines += _shape_tables(shape, policies, zoo["upper_bound_rps"], gpus, default, baselines, worst)
    return "\n".join(lines)


def summary_table(report: Mapping[str, Any], default: str, baselines: Sequence[str]) -> list[str]:
    """One row per zoo and shape: the default's goodput over the best baseline's (the default
    itself left out of the baselines), over each baseline's, and over the zoo's upper bound."""
    others = [p for p in baselines if p != default and p in report["policies"]]
    lines = [
        "| zoo | shape | "
        + f"{default} goodput (req/s) | best baseline | {default} / best | "
        + "".join(f"{default} / {p} | " for p in others)
        + f"{default} / upper bound |",
        "|---" * (6 + len(others)) + "|",
    ]
    for zoo_name, zoo in report["zoos"].items():
        for shape, policies in zoo["shapes"].items():
            if default not in policies:
                continue
            mine = policies[default]["goodput"]["mean"]
            goodputs = {p: policies[p]["goodput"]["mean"] for p in others}
            best = max(goodputs, key=goodputs.__getitem__) if goodputs else None
            best_cells = f"{best} ({goodputs[best]:.0f}) | {_ratio(mine, goodputs[best])}" if best else "- | -"
            lines.append(
                f"| {zoo_name} | {shape} | {mine:.0f} | {best_cells} | "
                + "".join(f"{_ratio(mine, g)} | " for g in goodputs.values())
                + f"{_ratio(mine, zoo['upper_bound_rps'])} |"
            )
    return lines


def _shape_tables(
    shape: str,
    policies: Mapping[str, Any],
    upper_bound: float,
    gpus: int,
    default: str | None,
    baselines: Sequence[str],
    worst: int,
) -> list[str]:
    lines = [f"### Gamma shape {shape}", ""]
    header = "| policy | goodput mean (req/s) | min | per seed | / upper bound | scheduler req/core-s at peak |"
    lines += [header, "|---" * 6 + "|"]
    for policy, entry in policies.items():
        goodput = entry["goodput"]
        at_peak = entry["points"].get("1", {}).get("mean", {})
        seeds = ", ".join(f"{g:.0f}" for g in goodput["per_seed"].values())
        lines.append(
            f"| {policy} | {goodput['mean']:.0f} | {goodput['min']:.0f} | {seeds} | {goodput['over_upper_bound']:.3f} | "
            f"{at_peak.get('scheduled_per_core_s', 0.0):.0f} |"
        )
    lines.append("")
    if default in policies:
        lines += _ratios(policies, default, baselines, upper_bound)
    lines += [
        "Flat top, at multiples of each policy's own peak p: in-SLO throughput / p, the worst model's bad rate, "
        "the overall bad rate (ideal: 1, -, 1 - 1/m).",
        "",
        "| policy | " + " | ".join(f"{m:g}x p" for m in FLAT_TOP_MULTIPLES) + " |",
        "|---" * (len(FLAT_TOP_MULTIPLES) + 1) + "|",
    ]
    for policy, entry in policies.items():
        cells = []
        for multiple in FLAT_TOP_MULTIPLES:
            mean = entry["points"].get(f"{multiple:g}", {}).get("mean")
            cells.append(
                f"{mean['in_slo_over_peak']:.3f} / {mean['worst_bad_rate']:.3f} / {mean['bad_rate']:.3f}" if mean else "-"
            )
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "GPU idle fraction under the peak, beside Symphony's ideal (p - o) / p.",
        "",
        "| policy | " + " | ".join(f"{m:g}x p (ideal {1 - m:.2f})" for m in IDLE_MULTIPLES) + " |",
        "|---" * (len(IDLE_MULTIPLES) + 1) + "|",
    ]
    for policy, entry in policies.items():
        cells = [_cell(entry["points"][f"{m:g}"]["mean"]["gpu_idle_fraction"]) if f"{m:g}" in entry["points"] else "-"
                 for m in IDLE_MULTIPLES]  # fmt: skip
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    multiples = sorted({*IDLE_MULTIPLES, *FLAT_TOP_MULTIPLES})
    lines += [
        "",
        f"Autoscaling signals (Symphony Section 4.4) on {gpus} GPUs: GPUs to add N r/(1-r) / to release N f "
        "(ideal: N (m - 1) / N (1 - m)).",
        "",
        "| policy | " + " | ".join(f"{m:g}x p" for m in multiples) + " |",
        "|---" * (len(multiples) + 1) + "|",
    ]
    for policy, entry in policies.items():
        cells = []
        for multiple in multiples:
            signal = entry["points"].get(f"{multiple:g}", {}).get("signal")
            cells.append(f"+{_cell(signal['gpus_to_add'], 1)} / -{_cell(signal['gpus_to_release'], 1)}" if signal else "-")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    lines += ["", f"The {worst} worst models at 1x p (bad rate, mean over seeds):", ""]
    for policy, entry in policies.items():
        lines.append(f"- {policy}: " + ", ".join(f"{name} {rate:.4f}" for name, rate in _worst_at(entry, "1", worst)))
    lines.append("")
    return lines


def _ratios(policies: Mapping[str, Any], default: str, baselines: Sequence[str], upper_bound: float) -> list[str]:
    """The default's goodput over the best other baseline's, over each baseline's, over the bound."""
    mine = policies[default]["goodput"]["mean"]
    others = {p: policies[p]["goodput"]["mean"] for p in baselines if p != default and p in policies}
    lines = []
    if others:
        best = max(others, key=others.__getitem__)
        lines.append(f"- {default} / best baseline ({best}): {_ratio(mine, others[best])}")
        lines += [f"- {default} / {policy}: {_ratio(mine, goodput)}" for policy, goodput in others.items()]
    if upper_bound:
        lines.append(f"- {default} / upper bound: {mine / upper_bound:.3f}")
    return [*lines, ""] if lines else []


def _ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.3f}" if denominator else "inf"


def _worst_at(entry: Mapping[str, Any], multiple: str, n: int) -> list[tuple[str, float]]:
    """The ``n`` models with the highest bad rate at ``multiple`` x p, averaged over the seeds."""
    runs = entry["points"].get(multiple, {}).get("runs", {})
    rates: dict[str, list[float]] = {}
    for run in runs.values():
        for name, counts in run["models"].items():
            rates.setdefault(name, []).append(_bad_rate(counts))
    means = [(name, statistics.fmean(values)) for name, values in rates.items()]
    return sorted(means, key=lambda item: -item[1])[:n]
