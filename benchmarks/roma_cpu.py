"""The CPU part of ROMA's evaluation (Section 5, Tables 1 and 2), one system after another.

    .venv/bin/python benchmarks/roma_cpu.py [--tests allapps,2apps-a,2apps-b] [--step-s 35]

For each test of ../shared/data/roma_experiment.csv and each system -- pi (ROMA's CT
controllers, 1 s), rules (RR+rules, 15 s), max (RR+max) and min (RR+min) -- it starts
`gateway serve`, drives every model of the test with open-loop Poisson arrivals whose rate
changes every 35 s through the listed steps, and reads the outcome back from the admin API.

Scaling to this machine (2 cores, executors get 1.5 of them, the gateway and this load
generator the rest):
- the paper's four applications are played by the example zoo's upconv models, from light to
  heavy: Skylines -> upconv_s, GoogLeNet -> upconv_m, ResNet -> upconv_l, VGG16 -> upconv_xl;
- rates are the paper's own requests per second;
- each SLA is the paper's divided by 10 (0.38 s -> 38 ms): the stand-ins are about ten times
  lighter than the paper's models on its CPUs, so each SLA stays a few service times long;
- RR+max shares all 1.5 cores out evenly; RR+min gives the whole node 1/6 of that (0.25
  cores), as the paper's 1 core of each 6-core worker.

Output: benchmarks/work/roma_cpu.json, and a markdown table beside the paper's Table 2.
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
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "work"
DATA = ROOT.parent / "shared" / "data"
MODELS = ROOT / "examples" / "models"
STAND_INS = {"Skylines": "upconv_s", "GoogLeNet": "upconv_m", "ResNet": "upconv_l", "VGG16": "upconv_xl"}
NODE_CORES = 1.5
SYSTEMS = {"pi": "RR+CT", "rules": "RR+rules", "max": "RR+max", "min": "RR+min", "pi@0.5": "RR+CT"}
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


def load_tests() -> dict[str, list[dict]]:
    tests: dict[str, list[dict]] = {}
    with open(DATA / "roma_experiment.csv") as handle:
        for row in csv.DictReader(handle):
            rates = [float(r) for r in row["rps_steps"].split("-")]
            tests.setdefault(row["test"], []).append({"app": row["app"], "sla_ms": float(row["sla_s"]) * 100, "rates": rates})
    return tests


def paper_table() -> dict[tuple[str, str], dict]:
    with open(DATA / "roma_results_table2.csv") as handle:
        return {(r["test"], r["system"]): r for r in csv.DictReader(handle)}


def config_text(apps: list[dict], policy: str, port: int, *, alpha: str = "", gpu: tuple[str, ...] = ()) -> str:
    """The config of one system: CPU control ``policy`` (at set point ``alpha``), and ``gpu``
    lines for a [gpu] table (with one GPU on the node) or none."""
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
        "",
    ]
    # RR+min: 1/6 of the node for all models together (the paper's 1 core of 6 per worker).
    min_cores = NODE_CORES / 6 / len(apps) if policy == "min" else 0.05
    for app in apps:
        model = STAND_INS[app["app"]]
        lines += [
            f"[models.{model}]",
            f'path = "{MODELS / model}.onnx"',
            f"sla_ms = {app['sla_ms']}",
            "max_batch_size = 8",
            f"cpu = {{ cores = {NODE_CORES / len(apps)}, min_cores = {min_cores}, max_cores = {NODE_CORES}, threads = 2 }}",
            "",
        ]
    return "\n".join(lines)


def write_config(path: Path, apps: list[dict], system: str, port: int) -> None:
    """A system is a control policy, optionally with its set point: "pi@0.5" is PI at alpha = 0.5."""
    policy, _, alpha = system.partition("@")
    path.write_text(config_text(apps, policy, port, alpha=alpha))


async def drive(base: str, apps: list[dict], step_s: float, seed: int) -> dict[str, list[tuple[float, float, int]]]:
    """Open-loop Poisson arrivals per model through its rate steps; (sent at, latency ms, status)."""
    results: dict[str, list[tuple[float, float, int]]] = {STAND_INS[a["app"]]: [] for a in apps}
    start = time.monotonic()
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
            results[model].append((sent - start, (time.monotonic() - sent) * 1000, status))

        async def model_load(app: dict, rng: random.Random) -> None:
            model = STAND_INS[app["app"]]
            tasks = set()
            t = 0.0
            for step, rate in enumerate(app["rates"]):
                end = (step + 1) * step_s
                while True:
                    t += rng.expovariate(rate)
                    if t >= end:
                        t = end
                        break
                    await asyncio.sleep(max(0.0, start + t - time.monotonic()))
                    task = asyncio.create_task(one(model, time.monotonic()))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)

        await asyncio.gather(*(model_load(app, random.Random(seed + i)) for i, app in enumerate(apps)))
    return results


@dataclass
class Served:
    """What one run of a system gave: the clients' view and the admin API's before and after."""

    results: dict[str, list[tuple[float, float, int]]]
    before: dict[str, dict]
    after: dict[str, dict]
    histories: dict[str, list[dict]]


def serve_and_drive(config: Path, port: int, apps: list[dict], step_s: float, seed: int) -> Served:
    """Start `gateway serve` on ``config``, drive the test's load through it, read the admin API, stop it."""
    log_path = config.with_suffix(".log")
    with log_path.open("wb") as log:
        command = [sys.executable, "-m", "gateway.cli", "serve", str(config)]
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{base}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"gateway did not start; see {log_path}")
            time.sleep(0.2)
        before = {m["name"]: m for m in requests.get(f"{base}/admin/models", timeout=10).json()["models"]}
        results = asyncio.run(drive(base, apps, step_s, seed))
        after = {m["name"]: m for m in requests.get(f"{base}/admin/models", timeout=10).json()["models"]}
        histories = {name: requests.get(f"{base}/admin/models/{name}/history", timeout=10).json()["history"] for name in after}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return Served(results, before, after, histories)


def run_system(test: str, apps: list[dict], policy: str, step_s: float, seed: int) -> dict:
    port = 18000 + random.Random().randrange(1000)
    config = WORK / f"roma-{test}-{policy}.toml"
    write_config(config, apps, policy, port)
    served = serve_and_drive(config, port, apps, step_s, seed)
    results, before, after, histories = served.results, served.before, served.after, served.histories

    latencies = [lat for rows in results.values() for _, lat, status in rows if status == 200] or [float("nan")]
    errors = sum(1 for rows in results.values() for *_, status in rows if status != 200)
    per_request = sum(
        1 for app in apps for _, lat, status in results[STAND_INS[app["app"]]] if status == 200 and lat > app["sla_ms"]
    )
    windows = sum(after[n]["stats"]["window_violations"] - before[n]["stats"]["window_violations"] for n in after)
    core_s = sum(after[n]["stats"]["core_seconds"] - before[n]["stats"]["core_seconds"] for n in after)
    return {
        "test": test,
        "system": policy,
        "requests": sum(len(rows) for rows in results.values()),
        "errors": errors,
        "mean_rt_ms": statistics.fmean(latencies),
        "max_rt_ms": max(latencies),
        "std_rt_ms": statistics.pstdev(latencies),
        "window_violations": windows,
        "request_violations": per_request,
        "core_seconds": core_s,
        "per_model": {name: {"sla_ms": after[name]["sla_ms"], "history": histories[name]} for name in after},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="2apps-a,2apps-b,allapps")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--step-s", type=float, default=35.0, help="seconds per rate step (the paper: 35)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--table", action="store_true", help="only print the table of the results so far")
    args = parser.parse_args()
    if args.table:
        table_only()
        return 0
    missing = [m for m in STAND_INS.values() if not (MODELS / f"{m}.onnx").exists()]
    if missing:
        raise SystemExit(f"missing models {missing}: run python examples/make_models.py")
    WORK.mkdir(exist_ok=True)
    tests = load_tests()
    out_path = WORK / "roma_cpu.json"
    rows = json.loads(out_path.read_text()) if out_path.exists() else []
    for test in args.tests.split(","):
        for policy in args.systems.split(","):
            row = run_system(test, tests[test], policy, args.step_s, args.seed)
            rows = [r for r in rows if (r["test"], r["system"]) != (test, policy)] + [row]
            out_path.write_text(json.dumps(rows, indent=1))
            print(
                f"{test} {policy}: mean {row['mean_rt_ms']:.1f} ms, max {row['max_rt_ms']:.1f}, std {row['std_rt_ms']:.1f}, "
                f"V {row['window_violations']} windows / {row['request_violations']} requests, {row['core_seconds']:.0f} core-s, "
                f"{row['requests']} requests, {row['errors']} errors",
                flush=True,
            )
    print_table(rows)
    return 0


def table_only() -> None:
    """Print the table again from benchmarks/work/roma_cpu.json (python benchmarks/roma_cpu.py --table)."""
    print_table(json.loads((WORK / "roma_cpu.json").read_text()))


def coarse_violations(row: dict, seconds: int = 10) -> int:
    """Windows of ``seconds`` control periods whose request-weighted mean response time was over
    the SLA. ROMA's Table 2 counts violations in tens, which suggests 10 s windows."""
    count = 0
    for model in row["per_model"].values():
        history = [h for h in model["history"] if h["requests"]]
        for start in range(0, len(history), seconds):
            chunk = history[start : start + seconds]
            served = sum(h["requests"] for h in chunk)
            if served and sum(h["mean_rt_ms"] * h["requests"] for h in chunk) / served > model["sla_ms"]:
                count += 1
    return count


def print_table(rows: list[dict]) -> None:
    paper = paper_table()
    print(
        "\n| test | system | mean ms | max ms | std ms | V (1 s windows) | V (10 s windows) | V (requests) | core-s "
        "| paper: mean s | max s | std s | V | core-s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda r: (r["test"], list(SYSTEMS).index(r["system"]))):
        p = paper[(row["test"], SYSTEMS[row["system"]])]
        print(
            f"| {row['test']} | {SYSTEMS[row['system']]} ({row['system']}) | {row['mean_rt_ms']:.1f} | {row['max_rt_ms']:.0f} | "
            f"{row['std_rt_ms']:.1f} | {row['window_violations']} | {coarse_violations(row)} | {row['request_violations']} | "
            f"{row['core_seconds']:.0f} | "
            f"{p['avg_rt_s']} | {p['max_rt_s']} | {p['std_rt_s']} | {p['violations']} | {p['core_seconds']} |"
        )


if __name__ == "__main__":
    sys.exit(main())
