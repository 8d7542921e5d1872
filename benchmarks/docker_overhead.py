"""Overhead of Docker executors against process executors: same model, same wrk command, one run.

    .venv/bin/python benchmarks/docker_overhead.py [--duration 10] [--rounds 2]

Serves the example MLP (batch-1 KServe v2 JSON body, as benchmarks/serving.py) with one
executor of 1 core, once with ``executor_backend = "process"`` and once with ``"docker"``
(the host-runtime image, the Unix socket bind-mounted into the container), alternating the two
for ``--rounds`` rounds so that drift of this shared machine falls on both. Each serving is
loaded by wrk at 1 and 8 connections. Prints a markdown table and the overhead per request
(median latency at one connection, docker minus process); results in
benchmarks/work/docker_overhead.json. Needs a Docker daemon and wrk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from serving import MODEL, ROOT, WORK, body, free_port, run_wrk, stop, wait_serving, wrk_script  # noqa: E402

BACKENDS = ("process", "docker")
CONNECTIONS = (1, 8)


def start_gateway(backend: str, port: int) -> subprocess.Popen:
    config = WORK / f"gateway-mlp-{backend}.toml"
    config.write_text(
        f'[server]\nmodel_dir = "{MODEL.parent}"\n\n[node]\ncpu_cores = 1\nexecutor_backend = "{backend}"\n\n'
        f'[models.mlp]\npath = "{MODEL}"\nsla_ms = 50\nmax_batch_size = 32\ncpu = {{ cores = 1.0, threads = 1 }}\n'
    )
    command = [sys.executable, "-m", "gateway.cli", "serve", str(config), "--port", str(port), "--log-level", "WARNING"]
    return subprocess.Popen(command, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds of wrk per point")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install -y wrk")
    payload = body()
    script = wrk_script(payload)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {b: [] for b in BACKENDS}
    for round_ in range(args.rounds):
        for backend in BACKENDS if round_ % 2 == 0 else reversed(BACKENDS):
            port = free_port()
            url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
            process = start_gateway(backend, port)
            try:
                wait_serving(url, payload, process)
                run_wrk(url, 8, 3, script)  # warm-up
                result = {str(c): run_wrk(url, c, args.duration, script) for c in CONNECTIONS}
                runs[backend].append(result)
                print(f"round {round_ + 1} {backend}: {result}", flush=True)
            finally:
                stop(process)
                time.sleep(1)

    def median(backend: str, connections: int, key: str) -> float:
        return statistics.median(r[str(connections)][key] for r in runs[backend])

    results = {"machine": f"{os.cpu_count()} cores, {sys.version.split()[0]}", "duration_s": args.duration, "runs": runs}
    (WORK / "docker_overhead.json").write_text(json.dumps(results, indent=2))
    print(f"\nmedian of {args.rounds} rounds\n| backend | conns | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|")
    for backend in BACKENDS:
        for c in CONNECTIONS:
            errors = sum(r[str(c)]["errors"] for r in runs[backend])
            print(
                f"| {backend} | {c} | {median(backend, c, 'rps'):.0f} | {median(backend, c, 'p50_ms'):.2f} | "
                f"{median(backend, c, 'p99_ms'):.2f} | {errors} |"
            )
    overhead = median("docker", 1, "p50_ms") - median("process", 1, "p50_ms")
    ratio = median("docker", 8, "rps") / median("process", 8, "rps")
    print(f"\ndocker - process, p50 at 1 connection: {overhead:+.3f} ms per request; req/s at 8 connections: {ratio:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
