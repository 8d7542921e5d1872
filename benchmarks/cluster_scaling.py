"""Throughput of a CPU-bound model on 1, 2 and 3 workers, and the latency of the network hop.

Each worker runs in a network namespace of its own (tests/netns.py: veth pairs on a bridge),
its model's CPU executor held to the same CFS quota (``--cores``, the fixed policy) by the
worker's own actuator. One dispatcher in the root namespace serves them over TCP, with closed-
loop clients (``gateway bench --concurrency``), in one run:

- ``local``: ``gateway serve`` alone, the executor on this host under the same quota;
- ``1``, ``2``, ``3`` workers behind one dispatcher.

Throughput is measured with enough clients to keep every executor busy. The hop is measured
with one client (no queueing) on a model that computes in a fraction of a millisecond (the MLP,
``--hop-cores``, 1 core by default), so that neither its compute nor the quota's throttling hides
it: the latency through the dispatcher and one worker minus the latency of ``gateway serve``
alone with the same executor. Writes benchmarks/work/cluster_scaling.json and prints Markdown
tables.

    sudo .venv/bin/python benchmarks/cluster_scaling.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster import WORKER_PORT, cluster_config, dispatcher, workers_on  # noqa: E402
from tests.helpers import run_gateway  # noqa: E402
from tests.netns import Hosts  # noqa: E402

WORK = ROOT / "benchmarks" / "work"
MODEL = {"upconv_m": {"path": "models/upconv_m.onnx", "sla_ms": 1000, "max_batch_size": 8}}
HOP_MODEL = {"mlp": {"path": "models/mlp.onnx", "sla_ms": 1000, "max_batch_size": 8}}


def bench(url: str, concurrency: int, duration_s: float, model: str = "upconv_m") -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        subprocess.run(
            [sys.executable, "-m", "gateway.cli", "bench", url, "--model", model, "--concurrency", str(concurrency)]
            + ["--duration", str(duration_s), "--quiet", "--output", output.name],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        return json.loads(Path(output.name).read_text())


def measure(url: str, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    bench(url, 2, 3.0)  # warm up: profiles, caches, the controllers' first periods
    hop = bench(url, 1, args.duration)
    loaded = bench(url, args.clients_per_worker * workers, args.duration)
    return {
        "workers": workers,
        "throughput_rps": loaded["throughput_rps"],
        "loaded_latency_ms": loaded["latency_ms"],
        "single_client_mean_ms": hop["latency_ms"]["mean"],
        "single_client_p50_ms": hop["latency_ms"]["p50"],
        "statuses": loaded["statuses"],
    }


def hop(url: str, args: argparse.Namespace) -> dict[str, float]:
    """One client on the light model: what a request costs besides its compute."""
    bench(url, 1, 2.0, "mlp")  # warm up
    result = bench(url, 1, args.duration, "mlp")
    return {"throughput_rps": result["throughput_rps"], **result["latency_ms"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=float, default=0.4, help="the CPU quota of each executor, in cores")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per measurement")
    parser.add_argument("--clients-per-worker", type=int, default=4)
    parser.add_argument("--hop-cores", type=float, default=1.0, help="the cores of the light model's executor")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    folder = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    env_models = {name: {**m, "cpu": {"cores": args.cores, "threads": 1}} for name, m in MODEL.items()}
    # The same executor, alone on this host: the baseline of the hop.
    local = cluster_config(folder / "local.toml", None, env_models, cpu_cores=args.cores)
    with run_gateway(local) as gateway:
        rows.append({**measure(gateway.base, 1, args), "system": "local"})
    with Hosts(3, prefix="gb") as hosts:
        for count in (1, 2, 3):
            endpoints = [f"{hosts.address(i)}:{WORKER_PORT}" for i in range(count)]
            config = cluster_config(folder / f"cluster{count}.toml", endpoints, env_models, cpu_cores=args.cores)
            with workers_on(hosts, count, config), dispatcher(config) as gateway:
                rows.append({**measure(gateway.base, count, args), "system": f"{count} worker{'s' * (count > 1)}"})
            print(f"{rows[-1]['system']}: {rows[-1]['throughput_rps']} req/s", file=sys.stderr)
    # The hop, on the light model: alone, then through one worker.
    light = {name: {**m, "cpu": {"cores": args.hop_cores, "threads": 1}} for name, m in HOP_MODEL.items()}
    hops: dict[str, dict[str, float]] = {}
    with run_gateway(cluster_config(folder / "hop-local.toml", None, light, cpu_cores=args.hop_cores)) as gateway:
        hops["local"] = hop(gateway.base, args)
    with Hosts(1, prefix="gh") as hosts:
        config = cluster_config(
            folder / "hop-cluster.toml", [f"{hosts.address(0)}:{WORKER_PORT}"], light, cpu_cores=args.hop_cores
        )
        with workers_on(hosts, 1, config), dispatcher(config) as gateway:
            hops["1 worker"] = hop(gateway.base, args)
    one = next(r for r in rows if r["system"] == "1 worker")
    result = {
        "cores_per_executor": args.cores,
        "rows": rows,
        "hop": hops,
        "hop_ms": {q: round(hops["1 worker"][q] - hops["local"][q], 3) for q in ("mean", "p50", "p99")},
    }
    (WORK / "cluster_scaling.json").write_text(json.dumps(result, indent=2))
    print("| system | throughput (req/s) | vs 1 worker | p50 / p99 under load (ms) | one client: mean / p50 (ms) |")
    print("|---|---|---|---|---|")
    for row in rows:
        ratio = row["throughput_rps"] / one["throughput_rps"]
        loaded = row["loaded_latency_ms"]
        print(
            f"| {row['system']} | {row['throughput_rps']:.1f} | {ratio:.2f}x | {loaded['p50']:.1f} / {loaded['p99']:.1f} "
            f"| {row['single_client_mean_ms']:.2f} / {row['single_client_p50_ms']:.2f} |"
        )
    print("\n| mlp, one client | req/s | mean (ms) | p50 (ms) | p99 (ms) |")
    print("|---|---|---|---|---|")
    for system, row in hops.items():
        print(f"| {system} | {row['throughput_rps']:.0f} | {row['mean']:.3f} | {row['p50']:.3f} | {row['p99']:.3f} |")
    added = result["hop_ms"]
    print(f"| the hop (1 worker minus local) | | {added['mean']:+.3f} | {added['p50']:+.3f} | {added['p99']:+.3f} |")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
