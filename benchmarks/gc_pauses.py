"""Garbage-collection pauses of `gateway serve` under load, with and without start-up's objects frozen.

    .venv/bin/python benchmarks/gc_pauses.py [--model cnn_small] [--rate 400] [--seconds 20] [--runs 2]

`gateway serve examples/config.toml` runs in a child process of this script that records every
collection of Python's cyclic garbage collector (``gc.callbacks``: its generation and how long
it held the interpreter, and so the event loop). Once the gateway is ready, `gateway bench`
sends open-loop Poisson load to one model; then the gateway is stopped. Two variants, one run
of each after the other, ``--runs`` times:

    frozen     as served: the gateway freezes what start-up made (``gc.freeze()`` in
               gateway/server.py's ``serve``), so a full collection walks only what serving made
    unfrozen   the same with ``gc.freeze`` made a no-op in the child

Printed per run: the collections of each generation while the load ran, the longest pause of
each, and the latency percentiles the client saw.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gateway_ready import wait_ready

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIG = ROOT / "examples" / "config.toml"
PORT = 8000  # examples/config.toml's


def child(config: str, report: str, unfrozen: bool) -> int:
    """Serve ``config`` while recording each collection; at exit write them to ``report``."""
    # (time.monotonic() at its end, generation, ms): CLOCK_MONOTONIC is one clock for every process.
    collections: list[tuple[float, int, float]] = []
    began: list[float] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began:
            collections.append((time.monotonic(), info["generation"], (time.perf_counter() - began[0]) * 1000))

    def write() -> None:
        Path(report).write_text(json.dumps({"collections": collections, "frozen": gc.get_freeze_count()}))

    gc.callbacks.append(record)
    atexit.register(write)
    if unfrozen:
        gc.freeze = lambda: None  # the gateway's call does nothing
    from gateway.cli import main

    return main(["serve", config])


def one_run(variant: str, args: argparse.Namespace, folder: Path) -> dict:
    report = folder / f"{variant}.json"
    command = [sys.executable, __file__, "--child", str(CONFIG), str(report)] + (["--unfrozen"] if variant == "unfrozen" else [])
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{PORT}"
        wait_ready(base, server, timeout_s=60)
        time.sleep(1.0)
        load_began = time.monotonic()
        output = folder / f"{variant}-bench.json"
        subprocess.run(
            [sys.executable, "-m", "gateway.cli", "bench", base, "--model", args.model, "--rate", str(args.rate),
             "--duration", str(args.seconds), "--quiet", "--output", str(output)],
            cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        load_ended = time.monotonic()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    recorded = json.loads(report.read_text())
    during = [(gen, ms) for at, gen, ms in recorded["collections"] if load_began <= at <= load_ended]
    bench = json.loads(output.read_text())
    return {
        "variant": variant,
        "frozen_objects": recorded["frozen"],
        "collections": {gen: sum(1 for g, _ in during if g == gen) for gen in (0, 1, 2)},
        "longest_ms": {gen: max([ms for g, ms in during if g == gen] or [0.0]) for gen in (0, 1, 2)},
        "latency_ms": bench["latency_ms"],
        "succeeded": bench["succeeded"],
        "requests": bench["requests"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn_small")
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "REPORT"), help=argparse.SUPPRESS)
    parser.add_argument("--unfrozen", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child, args.unfrozen)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for run in range(1, args.runs + 1):
            for variant in ("frozen", "unfrozen"):
                row = {"run": run, **one_run(variant, args, Path(folder))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{args.model} at {args.rate:g} requests/s for {args.seconds:g} s, examples/config.toml\n")
    print(
        "| run | variant | objects frozen | collections gen 0 / 1 / 2 | longest pause gen 0 / 1 / 2, ms "
        "| ok | p50 ms | p90 ms | p99 ms | max ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        c, longest, lat = row["collections"], row["longest_ms"], row["latency_ms"]
        print(
            f"| {row['run']} | {row['variant']} | {row['frozen_objects']:,} | {c[0]} / {c[1]} / {c[2]} "
            f"| {longest[0]:.1f} / {longest[1]:.1f} / {longest[2]:.1f} | {row['succeeded']}/{row['requests']} "
            f"| {lat['p50']:.1f} | {lat['p90']:.1f} | {lat['p99']:.1f} | {lat['max']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
