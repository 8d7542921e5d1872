"""How fast the CPU control plane follows a change: load steps and an SLA change at run time.

    .venv/bin/python benchmarks/roma_step.py [--scenarios step,step4x,sla-change] [--step-s 20] [--idle-s 20]
        [--time-scale K]

Three scenarios, each served by `gateway serve` with open-loop Poisson arrivals (the node,
models, SLAs and helpers of benchmarks/roma_cpu.py: 1.5 cores for the executors, upconv_m and
upconv_l playing GoogLeNet and ResNet with SLAs of 45 ms and 54 ms):

    step        upconv_m at 40 -> 120 -> 40 requests/s and upconv_l at 30 -> 70 -> 30 together,
                20 s steps; systems pi, ours, max
    step4x      upconv_m alone at 30 requests/s for 15 s, then 120 (four times as many in one
                second) for 20 s; systems pi, ours
    sla-change  upconv_m alone at a steady 80 requests/s; after 15 s its SLA is halved through
                the admin API (PUT /admin/models/upconv_m/sla), then 20 s more; then no load
                for 20 s (--idle-s); systems pi, ours

The systems are roma_cpu.py's: pi is ROMA's PI controllers (grant proportional), ours the
feedforward policy with grant deficit, max every core, static. 15 s is 0.75 x --step-s, 20 s
is --step-s.

The rates and SLAs above are those of the machine the stand-ins' times were set on
(roma_cpu.REFERENCE_CPU_MS). Where the stand-ins take k times as long, every SLA is k times
longer and every rate k times lower (k measured at the start, ``--time-scale`` to set it), so
that each model's demand in cores and its SLA in service times are as designed; the steps and
the control period keep their length in seconds.

What is measured:
- violations as the clients see them: 1 s windows by sending time whose mean response time of
  a model's answered requests was over its SLA (the SLA in force in that second);
- core-seconds as the admin API reports them (enforced), while the load runs;
- step4x: the control periods after the step until the per-second mean response time is back
  under the SLA and stays there to the end of the run, counted from the step (0: never over it);
- sla-change: the same from the SLA change, against the new SLA; and, once the load has
  stopped, the control periods until the model's cores (admin history) are at its min_cores;
- for both, beside "for good": the periods until the first second back under the SLA, and the
  violating seconds after that one (a single late second long after the change moves "for
  good" to it);
- beside each violating second of step4x and sla-change: the requests sent in it, the cores of
  the period step before it, and what benchmarks/stall_probe.py saw of the machine while its
  requests were served (the longest late wake-up of an idle process, and the most steal time
  of a second), with how many of the other seconds saw as much. This tells a second that the
  machine took from one that the control plane lost.
Plots: docs/roma/step.png, step4x.png and sla-change.png (per system and model, the mean
response time of each second against the SLA, dashed, and the cores of each control period).

Output: benchmarks/work/roma_step.json (every run's client samples and admin history) and
markdown tables on stdout; ``--table`` prints them and draws the plots again from the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from roma_cpu import (  # noqa: E402
    DOCS,
    MIN_CORES,
    MODELS,
    STAND_INS,
    SYSTEMS,
    WORK,
    Sample,
    add_time_scale_argument,
    config_text,
    cpu_time_ms,
    drive,
    model_record,
    ok_samples,
    plot_runs,
    ratio,
    run_time_scale,
    serve_and_drive,
    summary,
    window_means,
)
from stall_probe import HEAVY_STEAL_MS, in_second_sent  # noqa: E402

# Stalls of the machine (stall_probe.py) counted beside the violating seconds.
STALL_MS = (20, 50)
SCENARIOS = {"step": "pi,ours,max", "step4x": "pi,ours", "sla-change": "pi,ours"}
SLA_MS = {"GoogLeNet": 45.0, "ResNet": 54.0}  # the paper's divided by 10, as roma_cpu.py gives them
CHANGED_MODEL = STAND_INS["GoogLeNet"]


def workload(scenario: str, step_s: float, time_scale: float = 1.0) -> tuple[list[dict], float]:
    """The apps of a scenario (roma_cpu.drive's form, with their step lengths) and the time of
    its change: the step, or the SLA change (0 for the three-step test). ``time_scale`` k makes
    every SLA k times longer and every rate k times lower; the steps keep their seconds."""
    before = 0.75 * step_s  # 15 s at the default 20
    if scenario == "step":
        apps = [
            {"app": "GoogLeNet", "rates": [40, 120, 40], "durations": [step_s] * 3},
            {"app": "ResNet", "rates": [30, 70, 30], "durations": [step_s] * 3},
        ]
        change_s = 0.0
    elif scenario == "step4x":
        apps, change_s = [{"app": "GoogLeNet", "rates": [30, 120], "durations": [before, step_s]}], before
    elif scenario == "sla-change":
        apps, change_s = [{"app": "GoogLeNet", "rates": [80], "durations": [before + step_s]}], before
    else:
        raise SystemExit(f"unknown scenario {scenario!r}: choose from {', '.join(SCENARIOS)}")
    scaled = [
        {**app, "sla_ms": SLA_MS[app["app"]] * time_scale, "rates": [rate / time_scale for rate in app["rates"]]} for app in apps
    ]
    return scaled, change_s


def rates_text(row: dict, app: str) -> str:
    """An app's rates in a run, as '40 -> 120 -> 40'."""
    rates = next(a["rates"] for a in row["workload"] if a["app"] == app)
    return " -> ".join(f"{rate:.3g}" for rate in rates)


def sla_at(row: dict, name: str, window: int) -> float:
    """The SLA in force in a 1 s window: halved from the SLA change on, in the sla-change scenario."""
    sla = row["per_model"][name]["sla_ms"]
    if row["scenario"] == "sla-change" and name == CHANGED_MODEL and window >= int(row["change_s"]):
        return row["new_sla_ms"]
    return sla


def violations(row: dict, name: str) -> int:
    """1 s windows (by sending time) whose mean response time was over the SLA in force."""
    means = window_means(ok_samples(row["per_model"][name]))
    return sum(1 for window, mean in means.items() if mean > sla_at(row, name, window))


def seconds_after_change(row: dict, name: str) -> list[tuple[int, bool]]:
    """Each second of the load from the change on, counted from it, and whether its mean response
    time was over the SLA in force."""
    first = int(row["change_s"])
    means = window_means(ok_samples(row["per_model"][name]))
    return [(w - first, mean > sla_at(row, name, w)) for w, mean in means.items() if w >= first]


def settle_periods(row: dict, name: str) -> int | None:
    """Periods from the change until the per-second mean response time is under the SLA and
    stays there to the end of the load (0: never over it; None: still over it at the end)."""
    seconds = seconds_after_change(row, name)
    over = [period for period, late in seconds if late]
    if not over:
        return 0
    return None if over[-1] == seconds[-1][0] else over[-1] + 1


def recovery_periods(row: dict, name: str) -> int | None:
    """Periods from the change until the first second whose mean response time is under the SLA
    in force (0: the second of the change was; None: no second was, to the end of the load)."""
    return next((period for period, late in seconds_after_change(row, name) if not late), None)


def violations_after_recovery(row: dict, name: str) -> int:
    """The violating seconds after the first one back under the SLA (``recovery_periods``): where
    there is any, ``settle_periods`` counts to the last of them."""
    recovered = recovery_periods(row, name)
    if recovered is None:
        return 0
    return sum(1 for period, late in seconds_after_change(row, name) if period > recovered and late)


def idle_periods(row: dict, name: str) -> int | None:
    """Control periods after the load ended until the model's cores are at its min_cores
    (None: not within the idle time)."""
    after = row["per_model"][name]["history"][row["load_end"][name] :]
    for count, period in enumerate(after, 1):
        if period["cores"] <= row["min_cores"] + 1e-6:
            return count
    return None


def run(scenario: str, system: str, step_s: float, idle_s: float, seed: int, time_scale: float) -> dict:
    apps, change_s = workload(scenario, step_s, time_scale)
    port = 20000 + random.Random().randrange(1000)
    config = WORK / f"step-{scenario}-{system}.toml"
    spec = SYSTEMS[system]
    config.write_text(config_text(apps, spec.policy, port, alpha=spec.alpha, grant=spec.grant))
    new_sla = apps[0]["sla_ms"] / 2

    async def load(base: str, start: float) -> dict[str, list[Sample]]:
        async def change_sla() -> None:
            await asyncio.sleep(max(0.0, start + change_s - time.perf_counter()))
            async with aiohttp.ClientSession() as session:
                url = f"{base}/admin/models/{CHANGED_MODEL}/sla"
                async with session.put(url, json={"sla_ms": new_sla}) as response:
                    response.raise_for_status()

        if scenario != "sla-change":
            return await drive(base, apps, step_s, seed, start)
        results, _ = await asyncio.gather(drive(base, apps, step_s, seed, start), change_sla())
        return results

    served = serve_and_drive(config, port, apps, step_s, seed, load=load, idle_s=idle_s if scenario == "sla-change" else 0.0)
    per_model = {
        STAND_INS[app["app"]]: {
            "app": app["app"],
            **model_record(
                app["sla_ms"],
                served.results[STAND_INS[app["app"]]],
                served.histories[STAND_INS[app["app"]]],
                served.before[STAND_INS[app["app"]]],
                served.after[STAND_INS[app["app"]]],
            ),
        }
        for app in apps
    }
    return {
        "scenario": scenario,
        "system": system,
        "step_s": step_s,
        "time_scale": time_scale,
        "change_s": change_s,
        "new_sla_ms": new_sla if scenario == "sla-change" else None,
        "idle_s": idle_s if scenario == "sla-change" else 0.0,
        "min_cores": MIN_CORES,
        "clock_start": served.start,
        "load_end": served.load_end,
        "stalls": served.stalls,
        "workload": apps,
        **summary(per_model),
        "per_model": per_model,
    }


def stall_text(row: dict) -> str:
    """Beside each violating second of the changed model, the machine's longest stall and its
    steal time while that second's requests were served (stall_probe.py), and how many seconds
    of the whole load had a stall as long: a second the machine took, or one the control lost."""
    if not row.get("stalls"):
        return "no stall probe in this run"
    record = row["per_model"][CHANGED_MODEL]
    means = window_means(ok_samples(record))
    stalls = {w: in_second_sent(row["stalls"], w, sla_at(row, CHANGED_MODEL, w)) for w in means}
    over = [w for w, mean in means.items() if mean > sla_at(row, CHANGED_MODEL, w)]
    sent = Counter(int(s[0]) for s in record["samples"])
    # The cores of the period step taken just before the second began (a react raise within it is not in the history).
    cores = {round(h["t"] - row["clock_start"]): h["cores"] for h in record["history"]}
    cells = [
        f"{w} s ({means[w]:.0f} ms against {sla_at(row, CHANGED_MODEL, w):.0f}; {sent[w]} requests sent, "
        f"{cores.get(w, float('nan')):.2f} cores; stall {stalls[w][0]:.0f} ms, steal {stalls[w][1]:.0f} ms)"
        for w in over
    ]
    quiet = [w for w in means if w not in over]

    def share(seconds: list[int], kind: int, ms: float) -> str:
        return f"{sum(stalls[w][kind] > ms for w in seconds)}/{len(seconds)}"

    counts = [f"stall over {ms} ms {share(over, 0, ms)} violating, {share(quiet, 0, ms)} others" for ms in STALL_MS]
    heavy = HEAVY_STEAL_MS
    counts.append(f"steal over {heavy} ms {share(over, 1, heavy)} violating, {share(quiet, 1, heavy)} others")
    return f"{row['system']}: violating seconds {', '.join(cells) or 'none'}; " + "; ".join(counts)


def cell(periods: int | None, of: str = "the end") -> str:
    return "not by " + of if periods is None else str(periods)


def print_tables(rows: list[dict]) -> None:
    by = {(r["scenario"], r["system"]): r for r in rows}
    order = list(SYSTEMS)
    chosen = sorted((r for r in rows if r["scenario"] == "step"), key=lambda r: order.index(r["system"]))
    if chosen:
        names = list(chosen[0]["per_model"])
        row = chosen[0]
        print(
            f"\nstep: upconv_m {rates_text(row, 'GoogLeNet')} /s, upconv_l {rates_text(row, 'ResNet')} /s, "
            f"steps of {row['step_s']:g} s, time scale {row.get('time_scale', 1.0):.2f}\n"
        )
        print(
            "| system | "
            + " | ".join(f"V 1 s {n}" for n in names)
            + " | V 1 s | core-s | x pi | x max | mean ms | max ms | errors |"
        )
        print("|---|" + "---|" * (len(names) + 7))
        for row in chosen:
            per = [violations(row, n) for n in names]
            print(
                f"| {row['system']} | " + " | ".join(map(str, per)) + f" | {sum(per)} | {row['core_seconds']:.0f} "
                f"| {ratio(row, by.get(('step', 'pi')))} | {ratio(row, by.get(('step', 'max')))} "
                f"| {row['mean_rt_ms']:.1f} | {row['max_rt_ms']:.0f} | {row['errors']} |"
            )
    chosen = sorted((r for r in rows if r["scenario"] == "step4x"), key=lambda r: order.index(r["system"]))
    if chosen:
        row = chosen[0]
        print(
            f"\nstep4x: upconv_m {rates_text(row, 'GoogLeNet')} /s at {row['change_s']:g} s, then {row['step_s']:g} s, "
            f"SLA {row['per_model'][CHANGED_MODEL]['sla_ms']:.3g} ms, time scale {row.get('time_scale', 1.0):.2f}\n"
        )
        print(
            "| system | periods after the step until under the SLA for good | until first under it | V 1 s after that "
            "| V 1 s | core-s | mean ms | max ms | errors |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for row in chosen:
            print(
                f"| {row['system']} | {cell(settle_periods(row, CHANGED_MODEL))} | {cell(recovery_periods(row, CHANGED_MODEL))} "
                f"| {violations_after_recovery(row, CHANGED_MODEL)} | {violations(row, CHANGED_MODEL)} "
                f"| {row['core_seconds']:.0f} | {row['mean_rt_ms']:.1f} | {row['max_rt_ms']:.0f} | {row['errors']} |"
            )
        print()
        for row in chosen:
            print(f"- {stall_text(row)}")
    chosen = sorted((r for r in rows if r["scenario"] == "sla-change"), key=lambda r: order.index(r["system"]))
    if chosen:
        row = chosen[0]
        old = row["per_model"][CHANGED_MODEL]["sla_ms"]
        print(
            f"\nsla-change: upconv_m at {rates_text(row, 'GoogLeNet')} /s, SLA {old:.3g} -> {row['new_sla_ms']:.3g} ms "
            f"at {row['change_s']:g} s, load to {row['change_s'] + row['step_s']:g} s, then {row['idle_s']:g} s idle, "
            f"time scale {row.get('time_scale', 1.0):.2f}\n"
        )
        print(
            "| system | periods after the change until under the new SLA for good | until first under it "
            "| V 1 s after that | V 1 s | core-s (load) | periods after the load until min_cores | errors |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for row in chosen:
            print(
                f"| {row['system']} | {cell(settle_periods(row, CHANGED_MODEL))} | {cell(recovery_periods(row, CHANGED_MODEL))} "
                f"| {violations_after_recovery(row, CHANGED_MODEL)} | {violations(row, CHANGED_MODEL)} "
                f"| {row['core_seconds']:.0f} | {cell(idle_periods(row, CHANGED_MODEL), str(row['idle_s']) + ' s')} "
                f"| {row['errors']} |"
            )
        print()
        for row in chosen:
            print(f"- {stall_text(row)}")


def plot(rows: list[dict], scenario: str) -> Path | None:
    chosen = sorted((r for r in rows if r["scenario"] == scenario), key=lambda r: list(SYSTEMS).index(r["system"]))
    if not chosen:
        return None
    runs = []
    for row in chosen:
        note = f"V={sum(violations(row, n) for n in row['per_model'])}, {row['core_seconds']:.0f} core-s"
        if scenario != "step":
            note += f", settled in {cell(settle_periods(row, CHANGED_MODEL))}"
        runs.append((f"{row['system']} ({note})", row))
    marks = {
        "step": "rate steps",
        "step4x": "the step",
        "sla-change": "SLA halved",
    }
    title = f"{scenario}: mean RT per second vs SLA (dashed), cores per period (grey); {marks[scenario]} dotted"
    row = chosen[0]
    at = (row["step_s"], 2 * row["step_s"]) if scenario == "step" else (row["change_s"],)
    if scenario == "sla-change":
        at += (row["change_s"] + row["step_s"],)
    return plot_runs(runs, DOCS / f"{'step' if scenario == 'step' else scenario}.png", title, marks=at)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--systems", default="", help="of roma_cpu.py's; default: each scenario's own")
    parser.add_argument("--step-s", type=float, default=20.0, help="seconds of a step (the lead-in is 0.75 of it)")
    parser.add_argument("--idle-s", type=float, default=20.0, help="seconds with no load after sla-change")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--table", action="store_true", help="only print the tables and draw the plots of the results so far")
    add_time_scale_argument(parser)
    args = parser.parse_args()
    out_path = WORK / "roma_step.json"
    rows = json.loads(out_path.read_text()) if out_path.exists() else []
    if not args.table:
        if not all((MODELS / f"{m}.onnx").exists() for m in STAND_INS.values()):
            raise SystemExit("missing models: run python examples/make_models.py")
        WORK.mkdir(exist_ok=True)
        time_scale = run_time_scale(args.time_scale, lambda: {model: cpu_time_ms(model) for model in STAND_INS.values()})
        for scenario in args.scenarios.split(","):
            workload(scenario, args.step_s)  # fails early on an unknown name
            for system in (args.systems or SCENARIOS[scenario]).split(","):
                if system not in SYSTEMS:
                    raise SystemExit(f"unknown system {system!r}: choose from {', '.join(SYSTEMS)}")
                row = run(scenario, system, args.step_s, args.idle_s, args.seed, time_scale)
                rows = [r for r in rows if (r["scenario"], r["system"]) != (scenario, system)] + [row]
                out_path.write_text(json.dumps(rows, separators=(",", ":")))
                print(
                    f"{scenario} {system}: V {sum(violations(row, n) for n in row['per_model'])} 1 s windows, "
                    f"{row['core_seconds']:.0f} core-s, mean {row['mean_rt_ms']:.1f} ms, {row['requests']} requests, "
                    f"{row['errors']} errors",
                    flush=True,
                )
    print_tables(rows)
    for scenario in SCENARIOS:
        path = plot(rows, scenario)
        if path:
            print("plot:", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
