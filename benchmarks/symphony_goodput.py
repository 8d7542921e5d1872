"""Symphony's goodput of the default GPU policy beside the papers' baselines (``gateway simulate``).

    .venv/bin/python benchmarks/symphony_goodput.py [--quick] [--jobs 2] [--seeds 3] [--duration 10]

One run, side by side: the default policy (schedulers/gpu.py ``DEFAULT_POLICY``) and every
baseline (``BASELINES``), on both of Symphony's zoos (1080Ti and A100, ../shared/data) on 64
emulated GPUs, Gamma shapes 0.1, 0.3 and 1.0, 3 seeds, 10 virtual seconds per run. Per zoo,
shape and policy: the goodput (the highest offered load at which every model's bad rate is
within 1%, a bisection per seed, gateway/tools/goodput.py), its ratios to the best baseline,
to each baseline and to the zoo's upper bound, the flat-top table at 1.25x, 1.5x and 2x the
policy's own peak, the GPU idle fraction at 0.25x to 1x beside Symphony's ideal, the
autoscaling signals, the worst models and the scheduler's requests per core-second at the peak.

Writes benchmarks/work/symphony_goodput.json (per run and model: arrivals, in-SLO, late,
refused, left over) and symphony_goodput.md (the tables; ``_quick`` in both names with
``--quick``, ``_trial`` with other settings), and prints the tables.

Run time on the project's 2-core machine with ``--jobs 2``: about 30 minutes (a trial with 1
seed and shapes 0.1 and 1.0, 2/9 of the work, took 7.3 minutes while other work shared the
cores; a little under half of it is the bisections, the rest the 7 runs at multiples of each
peak; the A100 zoo, whose peaks run near 10,000-16,000 requests/s, takes most of it);
``--quick`` (shape 0.3, 2 seeds, 2 virtual s, a 2% bisection) about 75 seconds. The
scheduler's requests per core-second are read while the other job shares the machine:
compare them between policies of one run, not across machines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gateway.tools.goodput import TOLERANCE, markdown, measure
from gateway.tools.simulate import load_zoo
from schedulers.gpu import BASELINES, DEFAULT_POLICY

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"
ZOOS = {"1080ti": DATA / "symphony_zoo_1080ti.csv", "a100": DATA / "symphony_zoo_a100.csv"}
GPUS = 64  # Symphony Section 5.3's cluster
SHAPES = (0.1, 0.3, 1.0)  # Symphony Section 5.3's Gamma shapes, burstiest first
QUICK = {"shapes": (0.3,), "seeds": 2, "duration": 2.0, "tolerance": 0.02}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shape 0.3, 2 seeds, 2 virtual s, a 2%% bisection")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(f"{s:g}" for s in SHAPES), help="Gamma shapes, comma-separated")
    parser.add_argument("--duration", type=float, default=10.0, help="virtual seconds per run")
    parser.add_argument("--jobs", type=int, default=2, help="processes for the independent runs")
    parser.add_argument("--output-dir", type=Path, default=HERE / "work")
    args = parser.parse_args(argv)
    shapes = tuple(float(word) for word in args.shapes.split(","))
    seeds, duration, tolerance = args.seeds, args.duration, TOLERANCE
    # The full table's files are kept apart from those of trials with other settings.
    full = (shapes, seeds, duration) == (SHAPES, 3, 10.0) and not args.quick
    stem = "symphony_goodput" if full else "symphony_goodput_quick" if args.quick else "symphony_goodput_trial"
    if args.quick:
        shapes, seeds, duration, tolerance = QUICK["shapes"], QUICK["seeds"], QUICK["duration"], QUICK["tolerance"]
    policies = list(dict.fromkeys((DEFAULT_POLICY, *BASELINES)))
    started = time.perf_counter()
    report = measure(
        {name: load_zoo(path) for name, path in ZOOS.items()},
        gpus=GPUS,
        shapes=shapes,
        policies=policies,
        seeds=list(range(seeds)),
        duration_s=duration,
        tolerance=tolerance,
        jobs=args.jobs,
        progress=lambda line: print(f"[{time.perf_counter() - started:6.0f} s] {line}", flush=True),
    )
    elapsed = time.perf_counter() - started
    report["wall_s"] = elapsed
    command = " ".join(["benchmarks/symphony_goodput.py", *(sys.argv[1:] if argv is None else argv)])
    text = "\n".join(
        [
            f"# Symphony's goodput: {DEFAULT_POLICY} (default) beside the baselines",
            "",
            f"`.venv/bin/python {command}`: {GPUS} emulated GPUs, shapes {', '.join(f'{s:g}' for s in shapes)}, "
            f"{seeds} seeds, {duration:g} virtual s per run, bisection to {tolerance:.0%} of the upper bound; "
            f"{elapsed / 60:.1f} min with {args.jobs} jobs.",
            "",
            markdown(report, DEFAULT_POLICY, BASELINES),
        ]
    )
    print("\n" + text)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (args.output_dir / f"{stem}.md").write_text(text)
    print(f"\nwrote {args.output_dir / stem}.json and .md ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
