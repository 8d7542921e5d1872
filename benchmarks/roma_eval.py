"""ROMA's evaluation side by side (Section 5, Tables 1 and 2, Figure 2): six systems, one command.

    .venv/bin/python benchmarks/roma_eval.py [--tests 2apps-a,2apps-b,allapps] [--step-s 35]

Each system is a config of `gateway serve` with the four stand-in models on CPU executors and
one GPU executor (the real one with ``--gpu cuda`` where a GPU exists, else the emulated one):

    ROMA      GPU: ROMA's deficit (Algorithm 1)          CPU: PI controllers (eq. 11-12), grant proportional
    RR+CT     GPU: round robin                           CPU: PI controllers, grant proportional
    RR+rules  GPU: round robin                           CPU: rules, 15 s
    RR+max    GPU: round robin                           CPU: every core, static
    RR+min    GPU: round robin                           CPU: 1/6 of the node, static
    ours      GPU: schedulers.gpu's DEFAULT_POLICY       CPU: feedforward + PI, grant deficit

and, only where ``--systems`` names it, ``ours+roma-gpu`` (GPU: ROMA's deficit; CPU: ours').

A system named with a set point, such as ``--systems roma@0.6,ours@1.0``, runs with its CPU set
point moved (ROMA's PI and Algorithm 1's deficit at 0.6 SLA; ours' feed-forward at 1.0 SLA):
where the systems trade cores for violations, this compares them at equal violations too.

Every test of ../shared/data/roma_experiment.csv drives each model with open-loop Poisson
arrivals whose rate changes every 35 s through the listed steps (8 steps, 280 s).

Scaling to this machine (the rules of benchmarks/roma_cpu.py, plus the GPU):
- Skylines, GoogLeNet, ResNet, VGG16 are played by upconv_s, upconv_m, upconv_l, upconv_xl;
  each SLA is the paper's divided by 10 (the stand-ins take about a tenth of the paper's CPU
  time, so an SLA stays a similar multiple of a request's CPU time);
- rates are the paper's times RATE_SCALE = 2;
- on a machine where the stand-ins take k times their time on the machine these scales were
  set on (roma_cpu.REFERENCE_CPU_MS; k measured at the start, ``--time-scale`` to set it), the
  experiment runs k times slower: every SLA k times longer and every rate k times lower, so
  that each model's demand in cores and its SLA in service times are as designed (at k = 1.7,
  AllApps' peak step asked for 2.0 cores' worth of CPU time unscaled, more than the node's 1.5,
  and every system ran at its ceiling);
- the emulated GPU's time for a request of each model comes from a real GPU's profile,
  benchmarks/profiles/h100.csv (b1_ms: one request on an H100). Only upconv_l of the four
  stand-ins is in it, so every stand-in takes upconv_l's speedup, its CPU time on one core
  (measured at the start of the run: ONNX Runtime, one thread) over its H100 b1 time; upconv_l
  is the nearest measured model of the family (upconv_s, _m and _xl differ from it in channels
  only). The per-model ratios on the GPU are therefore those of the CPU times;
- then all GPU times are scaled by one common factor, chosen so that at the peak step of every
  test the demand on the GPU is at least GPU_OVERLOAD = 1.3 times what it can serve: the
  paper's regime, where "faster GPUs alone are usually not enough" (Section 1), and the CPU
  executors must take the rest. The factor, the GPU ms per model and the peak load per test
  are printed at the start and kept in the JSON;
- every device serves one request at a time, as ROMA's did (Algorithm 1 hands a free GPU "the
  first request in queue m_S", and the CPU scheduler "removes a request from a randomly
  selected queue"): each model's max_batch_size is 1 (``--max-batch``). The emulated GPU's
  batch of b costs b times one request (beta = 0: the H100's own fixed cost, 0.086 ms of
  upconv_l's 0.118 ms, would make batches nearly free, a regime ROMA did not run), so a batch
  would gain nothing and make each of its requests wait for the whole of it (runs before
  2026-11-25 allowed batches of up to 8: ``--max-batch 8``);
- the node has 1.5 cores for executors; RR+min gives all models together 1/6 of them.

What is measured, per test and system: mean, max and std of response time; violations as the
clients see them, 1 s and 10 s windows by sending time whose mean response time of a model's
requests (either device) was over its SLA, beside the admin API's count (CPU-served requests
only) and the requests over their SLA; core-seconds as the admin API reports them (enforced)
and their ratio to ROMA's and RR+max's; the least core-seconds that could have served the run's
CPU work (per model and 1 s period, the floor as its CFS quota enforced it, 0.1 core, or the CPU
time its executor used, whichever is more: every core busy every instant) and its ratio to
RR+max's; requests served on GPU and CPU; errors. One markdown table per test beside the
paper's Table 2, the violating windows per rate step, how many of each system's violating
windows fell in a second of heavy steal time on this machine (benchmarks/stall_probe.py: the
systems run one after the other, each through its own stretch of the machine), and plots like Figure 2,
docs/roma/eval-<test>.png (ours and ROMA: per model, mean response time per second against the
SLA, and cores per control period). Raw results, with every run's client samples and admin
history, in benchmarks/work/roma_eval.json; ``--table`` reprints from it.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from roma_cpu import (  # noqa: E402
    DOCS,
    MIN_CORES,
    STAND_INS,
    WORK,
    add_time_scale_argument,
    client_violations,
    config_text,
    cpu_time_ms,
    load_tests,
    model_record,
    ok_samples,
    paper_table,
    plot_runs,
    ratio,
    run_time_scale,
    serve_and_drive,
    summary,
    time_scaled,
    window_means,
)
from stall_probe import HEAVY_STEAL_MS, in_second_sent  # noqa: E402

from executors.limits import CFS_PERIOD_US, quota_cores  # noqa: E402
from schedulers.gpu import DEFAULT_POLICY  # noqa: E402

RATE_SCALE = 2
# The floor as the core-seconds count it: MIN_CORES (0.05) as the CFS quota enforces it, the
# least quota (1 ms) every 20 ms (executors/limits.py; 0.1 core before the period stretched).
ENFORCED_FLOOR = quota_cores(MIN_CORES, CFS_PERIOD_US)
H100_PROFILE = HERE / "profiles" / "h100.csv"
# The H100 row whose speedup each stand-in takes: the nearest measured model of its family.
H100_ROW = {"upconv_s": "upconv_l", "upconv_m": "upconv_l", "upconv_l": "upconv_l", "upconv_xl": "upconv_l"}
# The peak step of every test asks the GPU for at least this many times what it can serve.
GPU_OVERLOAD = 1.3
# Requests per batch on either device: ROMA's schedulers hand an executor one request at a time.
MAX_BATCH = 1
# name: (GPU policy, CPU control policy, grant, the paper's name)
SYSTEMS = {
    "roma": ("roma", "pi", "proportional", "ROMA"),
    "rr+ct": ("round_robin", "pi", "proportional", "RR+CT"),
    "rr+rules": ("round_robin", "rules", "proportional", "RR+rules"),
    "rr+max": ("round_robin", "max", "", "RR+max"),
    "rr+min": ("round_robin", "min", "", "RR+min"),
    "ours": (DEFAULT_POLICY, "feedforward", "deficit", None),
    # Not in the default run: ours' CPU control under ROMA's GPU order, to tell what each half does.
    "ours+roma-gpu": ("roma", "feedforward", "deficit", "ours, ROMA's GPU order"),
}
# The systems of the paper's Table 2, and ours: what a run without --systems runs.
DEFAULT_SYSTEMS = ("roma", "rr+ct", "rr+rules", "rr+max", "rr+min", "ours")


def split_system(system: str) -> tuple[str, str]:
    """A system with its CPU set point moved, as ``--systems`` names it: "roma@0.6" is ROMA with
    its PI (and Algorithm 1's deficit) at 0.6 SLA, "ours@1.0" ours with its feed-forward at 1.0
    SLA. Returns the system and the set point ("" where unchanged)."""
    base, _, setpoint = system.partition("@")
    return base, setpoint


def known_system(system: str) -> bool:
    """Whether ``--systems`` can run it: one of SYSTEMS, with a set point in (0, 1] only where a
    controller has one (pi, feedforward)."""
    base, setpoint = split_system(system)
    if base not in SYSTEMS or (setpoint and SYSTEMS[base][1] not in ("pi", "feedforward")):
        return False
    try:
        return not setpoint or 0 < float(setpoint) <= 1
    except ValueError:
        return False


def order(system: str) -> tuple[int, str]:
    """Where a system's row goes in the tables: after its base system."""
    base, setpoint = split_system(system)
    return list(SYSTEMS).index(base), setpoint


def peak_load(apps: list[dict], ms: dict[str, float]) -> float:
    """The busiest rate step of a test, in ms of work per second when a request of each model
    costs ``ms[model]``."""
    steps = max(len(app["rates"]) for app in apps)
    return max(
        sum(app["rates"][step] * ms[STAND_INS[app["app"]]] for app in apps if step < len(app["rates"])) for step in range(steps)
    )


def scaled_tests(tests: dict[str, list[dict]], time_scale: float) -> dict[str, list[dict]]:
    """The tests as this run drives them: rates RATE_SCALE times the paper's, and the whole
    experiment ``time_scale`` times slower (``time_scaled``)."""
    return time_scaled(tests, time_scale, RATE_SCALE)


def gpu_profile(tests: dict[str, list[dict]], cpu_ms: dict[str, float]) -> dict:
    """The emulated GPU's ms a request per model (see the module docstring), and how it was
    reached. ``tests`` carry the rates this run drives (``scaled_tests``); ``cpu_ms``: each
    stand-in's single-request time on one core, measured at the start of the run."""
    with open(H100_PROFILE) as handle:
        h100_b1 = {row["model"]: float(row["b1_ms"]) for row in csv.DictReader(handle)}
    speedup = {model: cpu_ms[row] / h100_b1[row] for model, row in H100_ROW.items()}
    h100_ms = {model: cpu_ms[model] / speedup[model] for model in cpu_ms}
    # one factor for every model: the lightest test's peak needs GPU_OVERLOAD x the GPU's 1000 ms a second
    scale = GPU_OVERLOAD * 1000 / min(peak_load(apps, h100_ms) for apps in tests.values())
    gpu_ms = {model: ms * scale for model, ms in h100_ms.items()}
    return {
        "cpu_ms": cpu_ms,
        "h100_row": H100_ROW,
        "h100_speedup": speedup,
        "h100_ms": h100_ms,
        "scale": scale,
        "gpu_ms": gpu_ms,
        # the GPU's load at each test's peak step (1 = all it can serve), and the same work in cores
        "peak_gpu_load": {test: peak_load(apps, gpu_ms) / 1000 for test, apps in tests.items()},
        "peak_cpu_cores": {test: peak_load(apps, cpu_ms) / 1000 for test, apps in tests.items()},
    }


def print_gpu(gpu: dict) -> None:
    print(
        f"emulated GPU: every stand-in takes the H100 speedup of {', '.join(sorted(set(gpu['h100_row'].values())))} "
        f"(the nearest measured model of its family), CPU ms / H100 b1 ms = "
        f"{gpu['h100_speedup']['upconv_l']:.1f}; then all times x {gpu['scale']:.1f} so that each test's peak step "
        f"needs at least {GPU_OVERLOAD}x the GPU; one request at a time (beta = 0)"
    )
    print("| model | CPU ms (1 core) | H100 ms | emulated GPU ms | GPU speedup over 1 core |")
    print("|---|---|---|---|---|")
    for model, ms in gpu["gpu_ms"].items():
        cpu = gpu["cpu_ms"][model]
        print(f"| {model} | {cpu:.3f} | {gpu['h100_ms'][model]:.4f} | {ms:.3f} | {cpu / ms:.2f} |")
    print("| test | peak GPU load (1 = its capacity) | peak demand in cores (CPU ms) |")
    print("|---|---|---|")
    for test, load in gpu["peak_gpu_load"].items():
        print(f"| {test} | {load:.2f} | {gpu['peak_cpu_cores'][test]:.2f} |", flush=True)


def write_profile(path: Path, gpu_ms: dict[str, float]) -> None:
    rows = ["model,alpha_ms,beta_ms"] + [f"{m},{ms:.4f},0" for m, ms in gpu_ms.items()]
    path.write_text("\n".join(rows) + "\n")


def write_config(
    path: Path, apps: list[dict], system: str, port: int, profile: Path, gpu_executor: str, max_batch: int = MAX_BATCH
) -> None:
    base, setpoint = split_system(system)
    gpu_policy, control, grant, _ = SYSTEMS[base]
    key = "feedforward_setpoint_ratio" if control == "feedforward" else "setpoint_ratio"
    gpu = (
        f'executor = "{gpu_executor}"',
        f'profile = "{profile}"',
        f'policy = "{gpu_policy}"',
        'emulated_outputs = "zeros"',  # the emulated GPU must not spend this machine's cores
    )
    moved = (f"{key} = {setpoint}",) if setpoint else ()
    path.write_text(config_text(apps, control, port, grant=grant, gpu=gpu, max_batch=max_batch, control=moved))


def run_system(
    test: str, apps: list[dict], system: str, step_s: float, seed: int, profile: Path, gpu: str, max_batch: int = MAX_BATCH
) -> dict:
    port = 19000 + random.Random().randrange(1000)
    config = WORK / f"eval-{test}-{system}.toml"
    write_config(config, apps, system, port, profile, gpu, max_batch)
    served = serve_and_drive(config, port, apps, step_s, seed)

    per_model = {}
    for app in apps:
        name = STAND_INS[app["app"]]
        before, after = served.before[name]["stats"], served.after[name]["stats"]

        def served_on(device: str, before: dict = before, after: dict = after) -> int:
            return after.get("served_on", {}).get(device, 0) - before.get("served_on", {}).get(device, 0)

        per_model[name] = {
            "app": app["app"],
            **model_record(app["sla_ms"], served.results[name], served.histories[name], served.before[name], served.after[name]),
            "served_gpu": served_on("gpu:0"),
            "served_cpu": served_on("cpu"),
        }
    return {
        "test": test,
        "system": system,
        "clock_start": served.start,
        "stalls": served.stalls,  # the machine's, from stall_probe.py
        **summary(per_model),
        "served_gpu": sum(m["served_gpu"] for m in per_model.values()),
        "served_cpu": sum(m["served_cpu"] for m in per_model.values()),
        "per_model": per_model,
    }


def floor_or_work(row: dict, duration_s: float) -> float | None:
    """The core-seconds under which no controller could have served this run's CPU work (its
    first ``duration_s``): per model and control period (1 s), the floor as enforced
    (``ENFORCED_FLOOR``) or the CPU time its executor used, whichever is more (cores busy every
    instant, no headroom for a queue). None for a run whose history does not carry the CPU time
    (older results)."""
    periods = [
        h
        for record in row["per_model"].values()
        for h in record["history"]
        if row["clock_start"] < h["t"] <= row["clock_start"] + duration_s
    ]
    if not periods or any("cpu_s" not in h for h in periods):
        return None
    return sum(max(ENFORCED_FLOOR, h["cpu_s"]) for h in periods)


def label(system: str, ours: str = "ours") -> str:
    """The system's name in tables and plots (``ours``: what to call ours)."""
    base, setpoint = split_system(system)
    return (SYSTEMS[base][3] or ours) + (f" @ {setpoint} SLA" if setpoint else "")


def plot(rows: list[dict], test: str, step_s: float) -> Path | None:
    """Figure 2 of the paper for one test, ours and ROMA side by side."""
    by_system = {r["system"]: r for r in rows if r["test"] == test}
    runs = [
        (f"{label(s)}: V={client_violations(by_system[s])}, {by_system[s]['core_seconds']:.0f} core-s", by_system[s])
        for s in ("ours", "roma")
        if s in by_system
    ]
    if not runs:
        return None
    title = f"{test}: mean RT per second (both devices) vs SLA (dashed), CPU cores per period (grey), rate steps dotted"
    marks = tuple(step * step_s for step in range(1, max(len(app["rates"]) for app in load_tests()[test])))
    return plot_runs(runs, DOCS / f"eval-{test}.png", title, marks)


def print_steps(rows: list[dict], step_s: float) -> None:
    """Where the violations are: per test, model and rate step, the violating 1 s windows of each system."""
    for test in sorted({r["test"] for r in rows}):
        chosen = sorted((r for r in rows if r["test"] == test), key=lambda r: order(r["system"]))
        print(f"\n{test}: violating 1 s windows (clients) per rate step (steps of {step_s:g} s)\n")
        print("| model | step | " + " | ".join(label(r["system"]) for r in chosen) + " |")
        print("|---|---|" + "---|" * len(chosen))
        for model in chosen[0]["per_model"]:
            steps = len(next(a for a in load_tests()[test] if STAND_INS[a["app"]] == model)["rates"])
            for step in range(steps):
                cells = []
                for row in chosen:
                    record = row["per_model"][model]
                    means = window_means([(t, lat) for t, lat in ok_samples(record) if step * step_s <= t < (step + 1) * step_s])
                    cells.append(str(sum(1 for mean in means.values() if mean > record["sla_ms"])))
                if any(c != "0" for c in cells):
                    app = chosen[0]["per_model"][model]["app"]
                    print(f"| {app} ({model}) | {step + 1} | " + " | ".join(cells) + " |")


def print_steal(rows: list[dict]) -> None:
    """Per test and system, how many of its violating 1 s windows (clients) fell while the
    hypervisor took ``HEAVY_STEAL_MS`` or more of the CPUs in a second (stall_probe.py), beside how
    many of the run's seconds did: the systems ran one after the other, each through its own
    share of the machine's bad seconds."""
    for test in sorted({r["test"] for r in rows}):
        chosen = sorted((r for r in rows if r["test"] == test and r.get("stalls")), key=lambda r: order(r["system"]))
        if not chosen:
            continue
        print(f"\n{test}: violating 1 s windows (clients) in a second of {HEAVY_STEAL_MS} ms steal or more (stall_probe.py)\n")
        print("| system | V 1 s | of them in such a second | seconds of the run with as much steal |")
        print("|---|---|---|---|")
        for row in chosen:
            stolen = {round(t) for t, ms in row["stalls"]["steal"] if ms >= HEAVY_STEAL_MS}
            over = [
                (w, record["sla_ms"])
                for record in row["per_model"].values()
                for w, mean in window_means(ok_samples(record)).items()
                if mean > record["sla_ms"]
            ]
            hit = sum(1 for w, sla_ms in over if in_second_sent(row["stalls"], w, sla_ms)[1] >= HEAVY_STEAL_MS)
            seconds = len(row["stalls"]["steal"])
            print(f"| {label(row['system'])} | {len(over)} | {hit} | {len(stolen)} of {seconds} |")


def print_tables(rows: list[dict], step_s: float) -> None:
    """One table per test, every system that ran, beside the paper's Table 2."""
    paper, tests = paper_table(), load_tests()
    for test in sorted({r["test"] for r in rows}):
        chosen = sorted((r for r in rows if r["test"] == test), key=lambda r: order(r["system"]))
        by_system = {r["system"]: r for r in chosen}
        duration_s = step_s * max(len(app["rates"]) for app in tests[test])
        print(f"\n{test}\n")
        print(
            "| system | mean ms | max ms | std ms | V 1 s (clients) | V 10 s (clients) | V 1 s (admin, CPU) | V requests "
            "| core-s | x ROMA | x RR+max | floor or CPU used, core-s (x RR+max) | GPU / CPU requests | errors "
            "| paper: mean s | max s | std s | V | core-s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        rr_max = by_system.get("rr+max")
        for row in chosen:
            base, setpoint = split_system(row["system"])
            name = SYSTEMS[base][3]
            p = paper.get((test, name)) if name and not setpoint else None
            theirs = (
                f"{p['avg_rt_s']} | {p['max_rt_s']} | {p['std_rt_s']} | {p['violations']} | {p['core_seconds']}"
                if p
                else " | ".join("-" * 5)
            )
            shown = label(row["system"], ours=f"ours ({DEFAULT_POLICY} + feedforward, deficit)")
            bound = floor_or_work(row, duration_s)
            least = "-" if bound is None else f"{bound:.1f}" + (f" ({bound / rr_max['core_seconds']:.2f})" if rr_max else "")
            print(
                f"| {shown} | {row['mean_rt_ms']:.1f} "
                f"| {row['max_rt_ms']:.0f} | {row['std_rt_ms']:.1f} | {client_violations(row)} | {client_violations(row, 10)} "
                f"| {row['window_violations']} | {row['request_violations']} | {row['core_seconds']:.0f} "
                f"| {ratio(row, by_system.get('roma'))} | {ratio(row, rr_max)} | {least} "
                f"| {row['served_gpu']} / {row['served_cpu']} | {row['errors']} | {theirs} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="2apps-a,2apps-b,allapps")
    parser.add_argument(
        "--systems", default=",".join(DEFAULT_SYSTEMS), help="from: " + ", ".join(SYSTEMS) + "; NAME@0.6 moves its CPU set point"
    )
    parser.add_argument("--step-s", type=float, default=35.0, help="seconds per rate step (the paper: 35)")
    parser.add_argument("--gpu", choices=["emulated", "cuda"], default="emulated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-batch", type=int, default=MAX_BATCH, help="each model's max_batch_size (ROMA: 1)")
    add_time_scale_argument(parser)
    parser.add_argument("--table", action="store_true", help="only print the tables and draw the plots of the results so far")
    args = parser.parse_args()
    out_path = WORK / "roma_eval.json"
    if args.table:
        saved = json.loads(out_path.read_text())
    else:
        unknown = [s for s in args.systems.split(",") if not known_system(s)]
        if unknown:
            raise SystemExit(f"unknown systems {unknown}: choose from {', '.join(SYSTEMS)}")
        if args.max_batch < 1:
            raise SystemExit(f"--max-batch must be at least 1, not {args.max_batch}")
        WORK.mkdir(exist_ok=True)
        cpu_ms = {model: cpu_time_ms(model) for model in STAND_INS.values()}
        time_scale = run_time_scale(args.time_scale, lambda: cpu_ms)
        tests = scaled_tests(load_tests(), time_scale)
        gpu = gpu_profile(tests, cpu_ms)
        print_gpu(gpu)
        print(f"every model's max_batch_size: {args.max_batch}")
        profile = WORK / "roma_eval_gpu.csv"
        write_profile(profile, gpu["gpu_ms"])
        saved = {
            "gpu": gpu,
            "gpu_overload": GPU_OVERLOAD,
            "rate_scale": RATE_SCALE,
            "time_scale": time_scale,
            "step_s": args.step_s,
            "max_batch": args.max_batch,
            "rows": [],
        }
        for test in args.tests.split(","):
            for system in args.systems.split(","):
                row = run_system(test, tests[test], system, args.step_s, args.seed, profile, args.gpu, args.max_batch)
                saved["rows"].append(row)
                out_path.write_text(json.dumps(saved, separators=(",", ":")))
                print(
                    f"{test} {system}: mean {row['mean_rt_ms']:.1f} ms, max {row['max_rt_ms']:.0f}, "
                    f"V {client_violations(row)} 1 s / {client_violations(row, 10)} 10 s windows (clients), "
                    f"{row['window_violations']} (admin), {row['request_violations']} requests, "
                    f"{row['core_seconds']:.0f} core-s, GPU {row['served_gpu']} CPU {row['served_cpu']}, {row['errors']} errors",
                    flush=True,
                )
    if isinstance(saved, list):  # an older file: the rows only
        saved = {"rows": saved}
    elif "gpu" in saved and args.table:
        print(f"time scale: {saved.get('time_scale', 1.0):.2f}")  # 1 in the runs before the option
        print_gpu(saved["gpu"])
        print(f"every model's max_batch_size: {saved.get('max_batch', 8)}")  # 8 in the runs before the option
    rows = saved["rows"]
    step_s = saved.get("step_s", args.step_s)
    print_tables(rows, step_s)
    print_steps(rows, step_s)
    print_steal(rows)
    for test in sorted({r["test"] for r in rows}):
        path = plot(rows, test, step_s)
        if path:
            print("plot:", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
