"""ROMA's evaluation side by side (Section 5, Tables 1 and 2, Figure 2): six systems, one command.

    .venv/bin/python benchmarks/roma_eval.py [--tests 2apps-a,2apps-b,allapps] [--step-s 35]

Each system is a config of `gateway serve` with the four stand-in models on CPU executors and
one GPU executor (the real one with ``--gpu cuda`` where a GPU exists, else the emulated one):

    ROMA      GPU: ROMA's deficit (Algorithm 1)          CPU: PI controllers (eq. 11-12)
    RR+CT     GPU: round robin                           CPU: PI controllers
    RR+rules  GPU: round robin                           CPU: rules, 15 s
    RR+max    GPU: round robin                           CPU: every core, static
    RR+min    GPU: round robin                           CPU: 1/6 of the node, static
    ours      GPU: deficit x requests per GPU-ms + Symphony deferral, CPU: PI controllers

Every test of ../shared/data/roma_experiment.csv drives each model with open-loop Poisson
arrivals whose rate changes every 35 s through the listed steps (8 steps, 280 s).

Scaling to this machine (the rules of benchmarks/roma_cpu.py, plus the GPU):
- Skylines, GoogLeNet, ResNet, VGG16 are played by upconv_s, upconv_m, upconv_l, upconv_xl;
  each SLA is the paper's divided by 10 (the stand-ins take about a tenth of the paper's CPU
  time, so an SLA stays a similar multiple of a request's CPU time);
- the emulated GPU serves a request of a model in its single-request CPU time on one core
  divided by GPU_SPEEDUP = 1 (measured at the start of the run with ONNX Runtime, one thread),
  with no gain from batching, as ROMA's GPU ran one request at a time;
- rates are the paper's times RATE_SCALE = 2, so that the run is in the paper's regime, where
  "faster GPUs alone are usually not enough" (Section 1): at the peak steps the demand is
  0.9 (2apps-a), 1.15 (2apps-b) and 1.2 (allapps) cores' worth of CPU time against a GPU worth
  one core, so the CPU executors must take the rest. At the paper's own rates the stand-ins are
  so light that the GPU alone serves every test and no scheduling or control choice matters.
- the node has 1.5 cores for executors; RR+min gives all models together 1/6 of them.

The report: per test and system, mean, max and std of response time, SLA violations per 1 s
control window and per request, core-seconds, requests served on GPU and CPU, errors; a
markdown table beside the paper's Table 2; PNG plots like Figure 2 (response time per control
period against the SLA per model, and cores, over time) under docs/roma/. Raw results in
benchmarks/work/roma_eval.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from roma_cpu import MODELS, ROOT, STAND_INS, WORK, config_text, load_tests, paper_table, serve_and_drive  # noqa: E402
from serving import median_ms  # noqa: E402

from schedulers.gpu import DEFAULT_POLICY  # noqa: E402

DOCS = ROOT / "docs" / "roma"
GPU_SPEEDUP = 1.0
RATE_SCALE = 2
# name: (GPU policy, CPU control policy, the paper's name)
SYSTEMS = {
    "roma": ("roma", "pi", "ROMA"),
    "rr+ct": ("round_robin", "pi", "RR+CT"),
    "rr+rules": ("round_robin", "rules", "RR+rules"),
    "rr+max": ("round_robin", "max", "RR+max"),
    "rr+min": ("round_robin", "min", "RR+min"),
    "ours": (DEFAULT_POLICY, "pi", None),
}


def cpu_time_ms(model: str) -> float:
    """Median single-request time of the model on one core (ONNX Runtime, one thread)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(MODELS / f"{model}.onnx"), options, providers=["CPUExecutionProvider"])
    x = np.full((1, 1, 8, 8), 0.5, np.float32)
    return median_ms(lambda: session.run(None, {"x": x}), 20, 100)


def write_profile(path: Path) -> dict[str, float]:
    gpu_ms = {model: cpu_time_ms(model) / GPU_SPEEDUP for model in STAND_INS.values()}
    rows = ["model,alpha_ms,beta_ms"] + [f"{m},{ms:.4f},0" for m, ms in gpu_ms.items()]
    path.write_text("\n".join(rows) + "\n")
    return gpu_ms


def write_config(path: Path, apps: list[dict], system: str, port: int, profile: Path, gpu_executor: str) -> None:
    gpu_policy, control, _ = SYSTEMS[system]
    gpu = (
        f'executor = "{gpu_executor}"',
        f'profile = "{profile}"',
        f'policy = "{gpu_policy}"',
        'emulated_outputs = "zeros"',  # the emulated GPU must not spend this machine's cores
    )
    path.write_text(config_text(apps, control, port, gpu=gpu))


def run_system(test: str, apps: list[dict], system: str, step_s: float, seed: int, profile: Path, gpu: str) -> dict:
    port = 19000 + random.Random().randrange(1000)
    config = WORK / f"eval-{test}-{system}.toml"
    write_config(config, apps, system, port, profile, gpu)
    served = serve_and_drive(config, port, apps, step_s, seed)
    results, before, after, histories = served.results, served.before, served.after, served.histories

    latencies = [lat for rows in results.values() for _, lat, status in rows if status == 200] or [float("nan")]

    def delta(name: str, *keys: str) -> float:
        a, b = after[name]["stats"], before[name]["stats"]
        for key in keys[:-1]:
            a, b = a.get(key, {}), b.get(key, {})
        return a.get(keys[-1], 0) - b.get(keys[-1], 0)

    per_model = {}
    for app in apps:
        name = STAND_INS[app["app"]]
        rows = results[name]
        ok = [lat for _, lat, status in rows if status == 200]
        per_model[name] = {
            "app": app["app"],
            "sla_ms": app["sla_ms"],
            "requests": len(rows),
            "mean_rt_ms": statistics.fmean(ok) if ok else None,
            "request_violations": sum(1 for lat in ok if lat > app["sla_ms"]),
            "window_violations": delta(name, "window_violations"),
            "served_gpu": delta(name, "served_on", "gpu:0"),
            "served_cpu": delta(name, "served_on", "cpu"),
            "history": histories[name],
            # per request: (sent at s, latency ms) for the plots
            "samples": [(round(t, 3), round(lat, 2)) for t, lat, status in rows if status == 200],
        }
    return {
        "test": test,
        "system": system,
        "requests": sum(len(rows) for rows in results.values()),
        "errors": sum(1 for rows in results.values() for *_, status in rows if status != 200),
        "mean_rt_ms": statistics.fmean(latencies),
        "max_rt_ms": max(latencies),
        "std_rt_ms": statistics.pstdev(latencies),
        "window_violations": sum(m["window_violations"] for m in per_model.values()),
        "request_violations": sum(m["request_violations"] for m in per_model.values()),
        "core_seconds": sum(after[n]["stats"]["core_seconds"] - before[n]["stats"]["core_seconds"] for n in after),
        "served_gpu": sum(m["served_gpu"] for m in per_model.values()),
        "served_cpu": sum(m["served_cpu"] for m in per_model.values()),
        "per_model": per_model,
    }


def plot(rows: list[dict], test: str) -> Path:
    """Figure 2 of the paper for one test: per system, the mean response time of each second's
    requests (both devices) against the SLA, and each model's CPU cores per control period."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [r for r in rows if r["test"] == test]
    chosen.sort(key=lambda r: list(SYSTEMS).index(r["system"]))
    figure, axes = plt.subplots(2, len(chosen), figsize=(4 * len(chosen), 6), sharex=True, squeeze=False)
    for column, row in enumerate(chosen):
        top, bottom = axes[0][column], axes[1][column]
        for index, (name, model) in enumerate(row["per_model"].items()):
            color = f"C{index}"
            windows: dict[int, list[float]] = {}
            for sent, latency in model["samples"]:
                windows.setdefault(int(sent), []).append(latency)
            seconds = sorted(windows)
            top.plot(seconds, [statistics.fmean(windows[t]) for t in seconds], color=color, lw=0.8,
                     label=f"{model['app']} ({name})")  # fmt: skip
            top.axhline(model["sla_ms"], color=color, ls="--", lw=0.8)
            history = model["history"]
            if history:
                t0 = history[0]["t"]
                bottom.plot([h["t"] - t0 for h in history], [h["cores"] for h in history], color=color, lw=0.8)
        title = SYSTEMS[row["system"]][2] or "ours (deferral)"
        top.set_title(f"{title}: V={client_window_violations(row)}, {row['core_seconds']:.0f} core-s", fontsize=9)
        top.set_ylabel("mean RT per 1 s (ms)")
        top.set_yscale("log")
        bottom.set_ylabel("cores")
        bottom.set_xlabel("s")
    axes[0][0].legend(fontsize=7)
    figure.suptitle(f"{test}: response time (all requests) against the SLA (dashed), and CPU cores", fontsize=10)
    figure.tight_layout()
    DOCS.mkdir(parents=True, exist_ok=True)
    path = DOCS / f"{test}.png"
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


def client_window_violations(row: dict) -> int:
    """1 s windows (by sending time) whose mean response time over all of a model's requests,
    on either device, was over its SLA: ROMA's V as the clients see it. The admin API's own
    window count covers the CPU-served requests only, which is what the CT controllers regulate."""
    count = 0
    for model in row["per_model"].values():
        windows: dict[int, list[float]] = {}
        for sent, latency in model["samples"]:
            windows.setdefault(int(sent), []).append(latency)
        count += sum(1 for values in windows.values() if statistics.fmean(values) > model["sla_ms"])
    return count


def print_steps(rows: list[dict], step_s: float) -> None:
    """Where the violations are: per test, model and rate step, the violating 1 s windows of each system."""
    for test in sorted({r["test"] for r in rows}):
        chosen = sorted((r for r in rows if r["test"] == test), key=lambda r: list(SYSTEMS).index(r["system"]))
        names = [SYSTEMS[r["system"]][2] or "ours" for r in chosen]
        print(f"\n{test}: violating 1 s windows per rate step (steps of {step_s:g} s)")
        print("| model | step | " + " | ".join(names) + " |")
        print("|---|---|" + "---|" * len(names))
        for model in chosen[0]["per_model"]:
            steps = len(next(a for a in load_tests()[test] if STAND_INS[a["app"]] == model)["rates"])
            for step in range(steps):
                cells = []
                for row in chosen:
                    windows: dict[int, list[float]] = {}
                    for sent, latency in row["per_model"][model]["samples"]:
                        if step * step_s <= sent < (step + 1) * step_s:
                            windows.setdefault(int(sent), []).append(latency)
                    sla = row["per_model"][model]["sla_ms"]
                    cells.append(str(sum(1 for v in windows.values() if statistics.fmean(v) > sla)))
                if any(c != "0" for c in cells):
                    app = chosen[0]["per_model"][model]["app"]
                    print(f"| {app} ({model}) | {step + 1} | " + " | ".join(cells) + " |")


def print_table(rows: list[dict]) -> None:
    paper = paper_table()
    print(
        "\n| test | system | mean ms | max ms | std ms | V (1 s windows) | V (CPU windows) | V (requests) | core-s "
        "| GPU / CPU requests | errors "
        "| paper: mean s | max s | std s | V | core-s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda r: (r["test"], list(SYSTEMS).index(r["system"]))):
        name = SYSTEMS[row["system"]][2]
        p = paper.get((row["test"], name)) if name else None
        theirs = (
            f"{p['avg_rt_s']} | {p['max_rt_s']} | {p['std_rt_s']} | {p['violations']} | {p['core_seconds']}"
            if p
            else "- | - | - | - | -"
        )
        print(
            f"| {row['test']} | {name or 'ours (deferral + PI)'} | {row['mean_rt_ms']:.1f} | {row['max_rt_ms']:.0f} | "
            f"{row['std_rt_ms']:.1f} | {client_window_violations(row)} | {row['window_violations']} | "
            f"{row['request_violations']} | {row['core_seconds']:.0f} | "
            f"{row['served_gpu']} / {row['served_cpu']} | {row['errors']} | {theirs} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="2apps-a,2apps-b,allapps")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--step-s", type=float, default=35.0, help="seconds per rate step (the paper: 35)")
    parser.add_argument("--gpu", choices=["emulated", "cuda"], default="emulated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--table", action="store_true", help="only print the table and draw the plots of the results so far")
    args = parser.parse_args()
    out_path = WORK / "roma_eval.json"
    if args.table:
        rows = json.loads(out_path.read_text())
    else:
        WORK.mkdir(exist_ok=True)
        profile = WORK / "roma_eval_gpu.csv"
        gpu_ms = write_profile(profile)
        print("GPU profile (ms a request):", {m: round(v, 3) for m, v in gpu_ms.items()}, flush=True)
        tests = load_tests()
        for apps in tests.values():
            for app in apps:
                app["rates"] = [rate * RATE_SCALE for rate in app["rates"]]
        rows = []
        for test in args.tests.split(","):
            for system in args.systems.split(","):
                row = run_system(test, tests[test], system, args.step_s, args.seed, profile, args.gpu)
                rows.append(row)
                meta = {"gpu_ms": gpu_ms, "gpu_speedup": GPU_SPEEDUP, "rate_scale": RATE_SCALE, "step_s": args.step_s}
                out_path.write_text(json.dumps({**meta, "rows": rows}, indent=1))
                print(
                    f"{test} {system}: mean {row['mean_rt_ms']:.1f} ms, max {row['max_rt_ms']:.0f}, V {row['window_violations']} "
                    f"windows / {row['request_violations']} requests, {row['core_seconds']:.0f} core-s, "
                    f"GPU {row['served_gpu']} CPU {row['served_cpu']}, {row['errors']} errors",
                    flush=True,
                )
        rows = json.loads(out_path.read_text())
    step_s = rows.get("step_s", args.step_s) if isinstance(rows, dict) else args.step_s
    rows = rows["rows"] if isinstance(rows, dict) else rows
    print_table(rows)
    print_steps(rows, step_s)
    for test in sorted({r["test"] for r in rows}):
        print("plot:", plot(rows, test))
    return 0


if __name__ == "__main__":
    sys.exit(main())
