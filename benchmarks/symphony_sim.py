"""GPU scheduling policies on the Symphony 1080Ti zoo with 64 emulated GPUs (``gateway simulate``).

    .venv/bin/python benchmarks/symphony_sim.py [--duration 2] [--shapes 0.1,0.3,1.0]

For each Gamma shape of the arrival gaps: sweep the offered load and find the rate where the
best policy reaches its peak goodput (the smallest rate within 1% of the highest goodput seen);
then run every policy from 0.5x to 2x that load (Symphony's flat-top, Section 4.4). Also
reports the scheduler's own throughput (requests scheduled per second of one core). Results in
benchmarks/work/symphony_sim.json and as markdown tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway.tools.simulate import load_zoo, simulate

HERE = Path(__file__).resolve().parent
ZOO = HERE.parent.parent / "shared" / "data" / "symphony_zoo_1080ti.csv"
GPUS = 64
# The four policies of the comparison (round_robin, ROMA's baseline, is left to benchmarks/roma_eval.py).
POLICIES = ("deferral", "roma", "work_conserving", "edf")
SWEEP = [4000, 8000, 12000, 16000, 24000, 32000, 48000, 64000]
MULTIPLES = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1.0, help="virtual seconds per run")
    parser.add_argument("--shapes", default="0.1,0.3,1.0")
    parser.add_argument("--zoo", type=Path, default=ZOO)
    args = parser.parse_args()
    zoo = load_zoo(args.zoo)
    out = {"gpus": GPUS, "zoo": args.zoo.name, "duration_s": args.duration, "shapes": {}}
    for shape in (float(s) for s in args.shapes.split(",")):
        sweep = {p: {r: simulate(zoo, GPUS, r, shape, p, args.duration) for r in SWEEP} for p in POLICIES}
        best = max(g["goodput_rps"] for runs in sweep.values() for g in runs.values())
        peak_rate = min(r for runs in sweep.values() for r, g in runs.items() if g["goodput_rps"] >= 0.99 * best)
        flat = {p: {m: simulate(zoo, GPUS, peak_rate * m, shape, p, args.duration) for m in MULTIPLES} for p in POLICIES}
        out["shapes"][str(shape)] = {"peak_rate": peak_rate, "sweep": sweep, "flat_top": flat}
        print(f"\nGamma shape {shape}: the best policy peaks at {peak_rate} req/s offered ({best:.0f} req/s goodput)")
        print(
            "| policy | "
            + " | ".join(f"{m}x" for m in MULTIPLES)
            + " | batch mean at 1x | GPU idle at 1x | scheduler req/core-s |"
        )
        print("|---" * (len(MULTIPLES) + 4) + "|")
        for policy in POLICIES:
            at = flat[policy]
            cells = " | ".join(f"{at[m]['goodput_rps']:.0f}" for m in MULTIPLES)
            one = at[1.0]
            tail = f"{one['batch_mean']:.1f} | {one['gpu_idle_fraction']:.3f} | {one['scheduled_per_core_s']:.0f}"
            print(f"| {policy} | {cells} | {tail} |", flush=True)
        (HERE / "work").mkdir(exist_ok=True)
        (HERE / "work" / "symphony_sim.json").write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
