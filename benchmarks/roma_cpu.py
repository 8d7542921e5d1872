"""The CPU part of ROMA's evaluation (Section 5, Tables 1 and 2), one system after another.

    .venv/bin/python benchmarks/roma_cpu.py [--tests allapps,2apps-a,2apps-b] [--systems pi,ours] [--step-s 35]

For each test of ../shared/data/roma_experiment.csv and each system it starts `gateway serve`,
drives every model of the test with open-loop Poisson arrivals whose rate changes every 35 s
through the listed steps, and reads the outcome back from the admin API. The systems:

    pi         RR+CT: ROMA's PI controllers (eq. 11-12), 1 s, grant = proportional (Algorithm 2)
    rules      RR+rules: the rule-based controller, 15 s
    max        RR+max: every core, static
    min        RR+min: 1/6 of the node, static
    ours       control policy feedforward (arrival rate x CPU s a request, plus the queue,
               corrected by ROMA's PI), grant = deficit (models furthest from their targets first)
    ours-prop  the same controllers, grant = proportional: the two grant rules side by side
    pi@0.5     (not run unless named) PI at set point alpha = 0.5

Scaling to this machine (2 cores, executors get 1.5 of them, the gateway and this load
generator the rest):
- the paper's four applications are played by the example zoo's upconv models, from light to
  heavy: Skylines -> upconv_s, GoogLeNet -> upconv_m, ResNet -> upconv_l, VGG16 -> upconv_xl;
- rates are the paper's own requests per second;
- each SLA is the paper's divided by 10 (0.38 s -> 38 ms): the stand-ins are about ten times
  lighter than the paper's models on its CPUs, so each SLA stays a few service times long;
- RR+max shares all 1.5 cores out evenly; RR+min gives the whole node 1/6 of that (0.25
  cores), as the paper's 1 core of each 6-core worker.
- on a machine where the stand-ins take k times their time on the machine these scales were
  set on (REFERENCE_CPU_MS; k measured at the start, ``--time-scale`` to set it), the whole
  experiment runs k times slower: every SLA k times longer and every rate k times lower, so
  that each model's demand in cores and its SLA in service times are as designed.

What is measured, per test and system:
- violations as the clients see them: 1 s windows by sending time in which the mean response
  time of a model's answered requests was over its SLA (ROMA's V), and the same over 10 s
  windows (ROMA's Table 2 counts in tens, which suggests such windows); beside them the admin
  API's own count (1 s control windows, by completion time) and the requests over their SLA;
- core-seconds as the admin API reports them (the cores enforced, period by period), and each
  system's ratio to PI's and to RR+max's;
- a plot per test, docs/roma/cpu-<test>.png: ours and pi, per model, the mean response time of
  each second's requests against the SLA (dashed) and the cores of each control period.

Output: benchmarks/work/roma_cpu.json (every run's client samples and admin history, so that
the plots can be redrawn), and one markdown table per test beside the paper's Table 2;
``--table`` prints them and draws the plots again from the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from gateway_ready import wait_ready  # noqa: E402
from stall_probe import probing  # noqa: E402

from tests.helpers import cpu_ms_per_request  # noqa: E402

WORK = HERE / "work"
DOCS = ROOT / "docs" / "roma"
DATA = ROOT.parent / "shared" / "data"
MODELS = ROOT / "examples" / "models"
STAND_INS = {"Skylines": "upconv_s", "GoogLeNet": "upconv_m", "ResNet": "upconv_l", "VGG16": "upconv_xl"}
NODE_CORES = 1.5
MIN_CORES = 0.05  # every model's floor, but under RR+min
# One request of each stand-in on one core of the machine these scales were set on (2026-11-23,
# docs/BENCHMARKS.md: "ROMA's CPU experiment"). On a machine where they take k times as long
# the whole experiment runs k times slower (``time_scaled``): every SLA k times longer, every
# rate k times lower, so that each model's demand in cores and its SLA in service times stay
# what they were (in roma_eval.py the emulated GPU's times scale with the CPU's too).
REFERENCE_CPU_MS = {"upconv_s": 2.7, "upconv_m": 4.9, "upconv_l": 7.0, "upconv_xl": 8.9}
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}).encode()

# One request as the client saw it: sent at (s from the start of the load), latency ms, HTTP status (0: no answer).
Sample = tuple[float, float, int]


@dataclass(frozen=True)
class System:
    """One configuration of the CPU control plane: [control] policy, grant and set point."""

    policy: str
    paper: str | None  # its name in ROMA's Table 2, if it is one of the paper's systems
    grant: str = ""  # "" leaves the gateway's default
    alpha: str = ""  # setpoint_ratio; "" leaves the default (ROMA's 0.8)


SYSTEMS = {
    "pi": System("pi", "RR+CT", grant="proportional"),
    "rules": System("rules", "RR+rules", grant="proportional"),
    "max": System("max", "RR+max"),
    "min": System("min", "RR+min"),
    "ours": System("feedforward", None, grant="deficit"),
    "ours-prop": System("feedforward", None, grant="proportional"),
    "pi@0.5": System("pi", "RR+CT", grant="proportional", alpha="0.5"),
}
DEFAULT_SYSTEMS = "pi,rules,max,min,ours,ours-prop"


def load_tests() -> dict[str, list[dict]]:
    tests: dict[str, list[dict]] = {}
    with open(DATA / "roma_experiment.csv") as handle:
        for row in csv.DictReader(handle):
            rates = [float(r) for r in row["rps_steps"].split("-")]
            tests.setdefault(row["test"], []).append({"app": row["app"], "sla_ms": float(row["sla_s"]) * 100, "rates": rates})
    return tests


def cpu_time_ms(model: str) -> float:
    """Median single-request time of the model on one core (ONNX Runtime, one thread)."""
    return cpu_ms_per_request(MODELS / f"{model}.onnx", warmup=20)


def machine_time_scale(cpu_ms: dict[str, float]) -> float:
    """How many times as long the stand-ins take here as on the reference machine
    (REFERENCE_CPU_MS): their single-request CPU times summed, over the reference's."""
    return sum(cpu_ms[model] for model in REFERENCE_CPU_MS) / sum(REFERENCE_CPU_MS.values())


def add_time_scale_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--time-scale",
        type=float,
        help="run the experiment this many times slower (default: the stand-ins' CPU time here over REFERENCE_CPU_MS)",
    )


def run_time_scale(requested: float | None, cpu_ms: Callable[[], dict[str, float]]) -> float:
    """The run's time scale: ``requested`` (--time-scale), else measured (``cpu_ms``, the
    stand-ins' single-request times here, over REFERENCE_CPU_MS); printed."""
    time_scale = requested if requested is not None else machine_time_scale(cpu_ms())
    if time_scale <= 0:
        raise SystemExit(f"--time-scale must be positive, not {time_scale}")
    print(f"time scale: {time_scale:.2f} (every SLA x {time_scale:.2f}, every rate / {time_scale:.2f})", flush=True)
    return time_scale


def time_scaled(tests: dict[str, list[dict]], time_scale: float, rate_scale: float = 1.0) -> dict[str, list[dict]]:
    """The tests as a run drives them: rates ``rate_scale`` times the paper's, and the whole
    experiment ``time_scale`` times slower (SLAs longer, rates lower by that factor)."""
    return {
        test: [
            {**app, "sla_ms": app["sla_ms"] * time_scale, "rates": [rate * rate_scale / time_scale for rate in app["rates"]]}
            for app in apps
        ]
        for test, apps in tests.items()
    }


def paper_table() -> dict[tuple[str, str], dict]:
    with open(DATA / "roma_results_table2.csv") as handle:
        return {(r["test"], r["system"]): r for r in csv.DictReader(handle)}


def config_text(
    apps: list[dict],
    policy: str,
    port: int,
    *,
    alpha: str = "",
    grant: str = "",
    gpu: tuple[str, ...] = (),
    max_batch: int = 8,
    control: tuple[str, ...] = (),
) -> str:
    """The config of one system: CPU control ``policy`` (at set point ``alpha``, arbitrated by
    ``grant``; empty: the gateway's defaults; ``control``: more lines of the [control] table),
    ``gpu`` lines for a [gpu] table (with one GPU on the node) or none, and each model's
    ``max_batch_size``."""
    lines = [
        "[server]",
        f"port = {port}",
        f'model_dir = "{MODELS}"',
        "[node]",
        f"cpu_cores = {NODE_CORES}",
        *(["gpus = [0]", "[gpu]", *gpu] if gpu else []),
        "[control]",
        f'policy = "{policy}"',
        *([f"setpoint_ratio = {alpha}"] if alpha else []),
        *([f'grant = "{grant}"'] if grant else []),
        *control,
        "",
    ]
    # RR+min: 1/6 of the node for all models together (the paper's 1 core of 6 per worker).
    min_cores = NODE_CORES / 6 / len(apps) if policy == "min" else MIN_CORES
    for app in apps:
        model = STAND_INS[app["app"]]
        lines += [
            f"[models.{model}]",
            f'path = "{MODELS / model}.onnx"',
            f"sla_ms = {app['sla_ms']}",
            f"max_batch_size = {max_batch}",
            f"cpu = {{ cores = {NODE_CORES / len(apps)}, min_cores = {min_cores}, max_cores = {NODE_CORES}, threads = 2 }}",
            "",
        ]
    return "\n".join(lines)


def write_config(path: Path, apps: list[dict], system: str, port: int) -> None:
    spec = SYSTEMS[system]
    path.write_text(config_text(apps, spec.policy, port, alpha=spec.alpha, grant=spec.grant))


async def drive(base: str, apps: list[dict], step_s: float, seed: int, start: float | None = None) -> dict[str, list[Sample]]:
    """Open-loop Poisson arrivals per model through its rate steps, each ``step_s`` long (or as
    long as the app's own "durations" list says); times count from ``start`` (time.perf_counter,
    the gateway's clock; default: now)."""
    results: dict[str, list[Sample]] = {STAND_INS[a["app"]]: [] for a in apps}
    start = time.perf_counter() if start is None else start
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(model: str, sent: float) -> None:
            try:
                async with session.post(
                    f"{base}/v2/models/{model}/infer", data=BODY, headers={"Content-Type": "application/json"}
                ) as r:
                    await r.read()
                    status = r.status
            except (TimeoutError, aiohttp.ClientError):
                status = 0  # no answer within the client's timeout: counted as an error
            results[model].append((sent - start, (time.perf_counter() - sent) * 1000, status))

        async def model_load(app: dict, rng: random.Random) -> None:
            model = STAND_INS[app["app"]]
            durations = app.get("durations") or [step_s] * len(app["rates"])
            tasks = set()
            t = end = 0.0
            for rate, duration in zip(app["rates"], durations, strict=True):
                end += duration
                while True:
                    t += rng.expovariate(rate) if rate > 0 else duration
                    if t >= end:
                        t = end
                        break
                    await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
                    task = asyncio.create_task(one(model, time.perf_counter()))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)

        await asyncio.gather(*(model_load(app, random.Random(seed + i)) for i, app in enumerate(apps)))
    return results


# A load: given the gateway's base URL and the start time, drive it and return the clients' samples.
Load = Callable[[str, float], Awaitable[dict[str, list[Sample]]]]


@dataclass
class Served:
    """What one run of a system gave: the clients' view and the admin API's before and after
    the load (``after`` when the load ended; ``histories`` after any idle time that followed)."""

    results: dict[str, list[Sample]]
    before: dict[str, dict]
    after: dict[str, dict]
    histories: dict[str, list[dict]]
    start: float = 0.0  # the load's time 0 on the gateway's clock (time.perf_counter)
    load_end: dict[str, int] = field(default_factory=dict)  # control periods in each history when the load ended
    stalls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # the machine's, during the load (stall_probe.py)


def serve_and_drive(
    config: Path, port: int, apps: list[dict], step_s: float, seed: int, *, load: Load | None = None, idle_s: float = 0.0
) -> Served:
    """Start `gateway serve` on ``config``, drive the test's load (or ``load``) through it with
    benchmarks/stall_probe.py watching the machine, read the admin API, wait ``idle_s`` with no
    load, read the histories, stop it."""
    log_path = config.with_suffix(".log")
    with log_path.open("wb") as log:
        command = [sys.executable, "-m", "gateway.cli", "serve", str(config)]
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def models() -> dict[str, dict]:
        return {m["name"]: m for m in requests.get(f"{base}/admin/models", timeout=10).json()["models"]}

    def histories(names) -> dict[str, list[dict]]:
        return {name: requests.get(f"{base}/admin/models/{name}/history", timeout=10).json()["history"] for name in names}

    try:
        wait_ready(base, process, log_path)
        before = models()
        # perf_counter is CLOCK_MONOTONIC on Linux, the clock of the gateway's history ("t")
        start = time.perf_counter() + 0.05
        with probing() as stalls:
            results = asyncio.run(load(base, start) if load else drive(base, apps, step_s, seed, start))
        after = models()
        load_end = {name: len(history) for name, history in histories(after).items()}
        if idle_s:
            time.sleep(idle_s)
        history = histories(after)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return Served(results, before, after, history, start, load_end, stalls.since(start))


# -- the clients' view -------------------------------------------------------------------------


def ok_samples(model: dict) -> list[tuple[float, float]]:
    """(sent at s, latency ms) of the answered requests of a model's record (also reads the
    older records, whose samples were answered requests only, as pairs)."""
    return [(s[0], s[1]) for s in model.get("samples", ()) if len(s) == 2 or s[2] == 200]


def window_means(samples: list[tuple[float, float]], seconds: float = 1.0) -> dict[int, float]:
    """Mean latency of the requests sent in each window of ``seconds``, by window index."""
    windows: dict[int, list[float]] = {}
    for sent, latency in samples:
        windows.setdefault(int(sent // seconds), []).append(latency)
    return {w: statistics.fmean(values) for w, values in sorted(windows.items())}


def client_violations(row: dict, seconds: float = 1.0) -> int:
    """ROMA's V as the clients see it: windows of ``seconds`` by sending time in which the mean
    response time of a model's answered requests was over its SLA, summed over the models."""
    return sum(
        sum(1 for mean in window_means(ok_samples(model), seconds).values() if mean > model["sla_ms"])
        for model in row["per_model"].values()
    )


def model_record(sla_ms: float, samples: list[Sample], history: list[dict], before: dict, after: dict) -> dict:
    """One model of one run, as kept in the JSON."""
    ok = [lat for _, lat, status in samples if status == 200]
    return {
        "sla_ms": sla_ms,
        "requests": len(samples),
        "errors": len(samples) - len(ok),
        "mean_rt_ms": statistics.fmean(ok) if ok else None,
        "request_violations": sum(1 for lat in ok if lat > sla_ms),
        "window_violations": after["stats"]["window_violations"] - before["stats"]["window_violations"],
        "core_seconds": after["stats"]["core_seconds"] - before["stats"]["core_seconds"],
        "history": history,
        "samples": [(round(t, 3), round(lat, 2), status) for t, lat, status in samples],
    }


def summary(per_model: dict[str, dict]) -> dict:
    """The totals of a run over its models."""
    latencies = [lat for model in per_model.values() for _, lat in ok_samples(model)] or [float("nan")]
    return {
        "requests": sum(m["requests"] for m in per_model.values()),
        "errors": sum(m["errors"] for m in per_model.values()),
        "mean_rt_ms": statistics.fmean(latencies),
        "max_rt_ms": max(latencies),
        "std_rt_ms": statistics.pstdev(latencies),
        "window_violations": sum(m["window_violations"] for m in per_model.values()),
        "request_violations": sum(m["request_violations"] for m in per_model.values()),
        "core_seconds": sum(m["core_seconds"] for m in per_model.values()),
    }


def ratio(row: dict, base: dict | None) -> str:
    """``row``'s core-seconds as a multiple of ``base``'s."""
    if not base or not base["core_seconds"]:
        return "-"
    return f"{row['core_seconds'] / base['core_seconds']:.2f}"


def plot_runs(runs: list[tuple[str, dict]], path: Path, title: str, marks: tuple[float, ...] = ()) -> Path:
    """One column per run (label, row), one row of panels per model: the mean response time of
    each second's requests (by sending time) against the SLA in force (dashed), and on the right
    axis the cores of each control period (grey), from the admin history; dotted lines at the
    times in ``marks`` (s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    names = list(dict.fromkeys(name for _, row in runs for name in row["per_model"]))
    figure, axes = plt.subplots(len(names), len(runs), figsize=(4.2 * len(runs), 2.3 * len(names)), sharex="col", squeeze=False)
    for column, (label, row) in enumerate(runs):
        for line, name in enumerate(names):
            top = axes[line][column]
            model = row["per_model"].get(name)
            if model is None:
                top.set_axis_off()
                continue
            means = window_means(ok_samples(model))
            top.plot([w + 0.5 for w in means], list(means.values()), color="C0", lw=0.8)
            history = model["history"]
            # the history's "t" is the end of a period on the gateway's clock
            zero = row.get("clock_start") or (history[0]["t"] - 1 if history else 0.0)
            times = [h["t"] - zero for h in history]
            if history:  # the first period's SLA from time 0
                slas = [h["sla_ms"] for h in history]
                top.step([0.0, *times], [slas[0], *slas], where="pre", color="C3", ls="--", lw=0.8)
            else:
                top.axhline(model["sla_ms"], color="C3", ls="--", lw=0.8)
            for at in marks:
                top.axvline(at, color="0.6", ls=":", lw=0.8)
            top.set_yscale("log")
            top.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            top.yaxis.set_major_formatter(ScalarFormatter())
            top.yaxis.set_minor_formatter(NullFormatter())
            top.set_ylabel("RT ms / 1 s", fontsize=7)
            top.tick_params(labelsize=7)
            top.set_title(f"{label}: {name}", fontsize=8)
            cores = top.twinx()
            cores.step(times, [h["cores"] for h in history], where="pre", color="0.4", lw=0.8)
            cores.set_ylim(0, NODE_CORES * 1.05)
            cores.set_ylabel("cores", fontsize=7)
            cores.tick_params(labelsize=7)
        axes[-1][column].set_xlabel("s", fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


# -- this benchmark ----------------------------------------------------------------------------


def run_system(test: str, apps: list[dict], system: str, step_s: float, seed: int) -> dict:
    port = 18000 + random.Random().randrange(1000)
    config = WORK / f"roma-{test}-{system}.toml"
    write_config(config, apps, system, port)
    served = serve_and_drive(config, port, apps, step_s, seed)
    per_model = {}
    for app in apps:
        name = STAND_INS[app["app"]]
        per_model[name] = {
            "app": app["app"],
            **model_record(app["sla_ms"], served.results[name], served.histories[name], served.before[name], served.after[name]),
        }
    return {
        "test": test,
        "system": system,
        "step_s": step_s,
        "clock_start": served.start,
        "stalls": served.stalls,  # the machine's, from stall_probe.py
        **summary(per_model),
        "per_model": per_model,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="2apps-a,2apps-b,allapps")
    parser.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"of {', '.join(SYSTEMS)}")
    parser.add_argument("--step-s", type=float, default=35.0, help="seconds per rate step (the paper: 35)")
    parser.add_argument("--seed", type=int, default=1)
    add_time_scale_argument(parser)
    parser.add_argument("--table", action="store_true", help="only print the tables and draw the plots of the results so far")
    args = parser.parse_args()
    out_path = WORK / "roma_cpu.json"
    if args.table:
        report(json.loads(out_path.read_text()))
        return 0
    missing = [m for m in STAND_INS.values() if not (MODELS / f"{m}.onnx").exists()]
    if missing:
        raise SystemExit(f"missing models {missing}: run python examples/make_models.py")
    unknown = [s for s in args.systems.split(",") if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}: choose from {', '.join(SYSTEMS)}")
    WORK.mkdir(exist_ok=True)
    time_scale = run_time_scale(args.time_scale, lambda: {model: cpu_time_ms(model) for model in STAND_INS.values()})
    tests = time_scaled(load_tests(), time_scale)
    rows = json.loads(out_path.read_text()) if out_path.exists() else []
    for test in args.tests.split(","):
        for system in args.systems.split(","):
            row = {**run_system(test, tests[test], system, args.step_s, args.seed), "time_scale": time_scale}
            rows = [r for r in rows if (r["test"], r["system"]) != (test, system)] + [row]
            out_path.write_text(json.dumps(rows, separators=(",", ":")))
            print(
                f"{test} {system}: mean {row['mean_rt_ms']:.1f} ms, max {row['max_rt_ms']:.1f}, "
                f"V {client_violations(row)} 1 s / {client_violations(row, 10)} 10 s windows (clients), "
                f"{row['window_violations']} (admin), {row['request_violations']} requests, {row['core_seconds']:.0f} core-s, "
                f"{row['requests']} requests, {row['errors']} errors",
                flush=True,
            )
    report(rows)
    return 0


def report(rows: list[dict]) -> None:
    print_tables(rows)
    for test in sorted({r["test"] for r in rows}):
        runs = [(f"{name} ({row['system']})", row) for name, row in plotted(rows, test, ("ours", "ours"), ("pi", "RR+CT"))]
        if runs:
            step_s = runs[0][1].get("step_s", 35.0)
            steps = max(len(app["rates"]) for app in load_tests()[test])
            title = f"{test}: mean RT per second vs SLA (dashed), cores per period (grey), rate steps dotted"
            marks = tuple(step * step_s for step in range(1, steps))
            print("plot:", plot_runs(runs, DOCS / f"cpu-{test}.png", title, marks))


def plotted(rows: list[dict], test: str, *wanted: tuple[str, str]) -> list[tuple[str, dict]]:
    """The rows of ``test`` for the (system, label) pairs wanted, those that ran."""
    by_system = {r["system"]: r for r in rows if r["test"] == test}
    return [(label, by_system[system]) for system, label in wanted if system in by_system]


def print_tables(rows: list[dict]) -> None:
    """One table per test: every system that ran, against the paper's Table 2."""
    paper = paper_table()
    order = list(SYSTEMS)
    for test in sorted({r["test"] for r in rows}):
        chosen = sorted((r for r in rows if r["test"] == test), key=lambda r: order.index(r["system"]))
        by_system = {r["system"]: r for r in chosen}
        print(f"\n{test} (steps of {chosen[0].get('step_s', 35):g} s)\n")
        print(
            "| system | mean ms | max ms | std ms | V 1 s (clients) | V 10 s (clients) | V 1 s (admin) | V requests "
            "| core-s | x PI | x RR+max | errors | paper: mean s | max s | std s | V | core-s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for row in chosen:
            name = SYSTEMS[row["system"]].paper
            p = paper.get((test, name)) if name else None
            theirs = (
                f"{p['avg_rt_s']} | {p['max_rt_s']} | {p['std_rt_s']} | {p['violations']} | {p['core_seconds']}"
                if p
                else " | ".join("-" * 5)
            )
            print(
                f"| {name or 'ours'} ({row['system']}) | {row['mean_rt_ms']:.1f} | {row['max_rt_ms']:.0f} "
                f"| {row['std_rt_ms']:.1f} "
                f"| {client_violations(row)} | {client_violations(row, 10)} | {row['window_violations']} "
                f"| {row['request_violations']} | {row['core_seconds']:.0f} | {ratio(row, by_system.get('pi'))} "
                f"| {ratio(row, by_system.get('max'))} | {row['errors']} | {theirs} |"
            )


if __name__ == "__main__":
    sys.exit(main())
