"""A short `gateway serve` run on a real GPU (ONNX Runtime's CUDA provider) beside CPU executors.

    python benchmarks/gpu_serve.py [--rate 400] [--seconds 10] [--no-warmup] [--cudnn-conv-algo-search exhaustive]
                                   [--batch-shapes fixed]

Two models of the example zoo (mlp, cnn_small), one CPU executor each (1 core) and one GPU
executor holding both, the default GPU policy, Poisson arrivals split evenly, batch-1 JSON.
Prints, per model: answers by status, where they ran, p50/p99 response time, and the l(b) the
gateway measured on the GPU and on the CPU (GET /admin/models/NAME, "profiles"), and how long
the gateway took to be ready and what the GPU executor's warm-up took ([gpu] warmup, on unless
``--no-warmup``). ``--batch-shapes`` and ``--cudnn-conv-algo-search`` set [gpu]'s keys of those
names. Needs an NVIDIA GPU and onnxruntime-gpu; it says so and exits 2 without them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import uvloop
from gateway_ready import wait_ready

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"mlp": [1, 512], "cnn_small": [1, 3, 32, 32]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def drive(base: str, rate: float, seconds: float) -> dict[str, list[tuple[int, str, float]]]:
    rng = random.Random(1)
    bodies = {
        name: json.dumps({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": [0.1] * int(np.prod(shape))}]})
        for name, shape in MODELS.items()
    }
    arrivals, t = [], 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        arrivals.append((t, rng.choice(list(MODELS))))
    results: dict[str, list[tuple[int, str, float]]] = {name: [] for name in MODELS}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:

        async def one(model: str, due: float) -> None:
            async with session.post(f"{base}/v2/models/{model}/infer", data=bodies[model]) as response:
                answer = orjson.loads(await response.read())
                where = answer.get("parameters", {}).get("executed_on", "-") if response.status == 200 else "-"
                # Timed from when it was due (no coordinated omission): the client's own lag counts.
                results[model].append((response.status, where, (time.perf_counter() - due) * 1000))

        # One generator sends each request when it is due. (Creating every request's task up front
        # took longer than the lead it had at 1,500 requests/s: the first ones started late.)
        start, tasks = time.perf_counter() + 0.1, []
        for at, model in arrivals:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(model, start + at)))
        await asyncio.gather(*tasks)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-warmup", action="store_true", help="[gpu] warmup = false")
    parser.add_argument("--cudnn-conv-algo-search", choices=["exhaustive", "heuristic", "default"], default="exhaustive")
    parser.add_argument("--batch-shapes", choices=["fixed", "exact"], default="fixed")
    args = parser.parse_args()
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"no CUDA provider in onnxruntime {ort.__version__}: nothing to measure", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="gpu-serve-"))
    for name in MODELS:
        shutil.copy(ROOT / "examples" / "models" / f"{name}.onnx", folder / f"{name}.onnx")
    port = free_port()
    (folder / "config.toml").write_text(
        f"""
[server]
port = {port}
[node]
cpu_cores = 2.0
gpus = [0]
[gpu]
executor = "cuda"
warmup = {"false" if args.no_warmup else "true"}
cudnn_conv_algo_search = "{args.cudnn_conv_algo_search}"
batch_shapes = "{args.batch_shapes}"
[control]
policy = "fixed"
[models.mlp]
path = "mlp.onnx"
sla_ms = 50
max_batch_size = 32
cpu = {{ cores = 1.0, threads = 1 }}
[models.cnn_small]
path = "cnn_small.onnx"
sla_ms = 100
max_batch_size = 32
cpu = {{ cores = 1.0, threads = 1 }}
"""
    )
    log = (folder / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", str(folder / "config.toml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        import requests

        try:
            ready_s = wait_ready(base, process, folder / "gateway.log")
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        executors = requests.get(f"{base}/admin/models/{next(iter(MODELS))}", timeout=10).json()["executors"]
        gpu_providers = {e["provider"] for e in executors if e["id"].startswith("gpu")}
        if gpu_providers != {"CUDAExecutionProvider"}:
            print(f"the GPU executor runs {gpu_providers}, not the CUDA provider: nothing to measure", file=sys.stderr)
            return 2
        results = uvloop.run(drive(base, args.rate, args.seconds))
        warmup = "off" if args.no_warmup else "on"
        print(
            f"rate {args.rate:g} req/s for {args.seconds:g} s, default GPU policy, CUDA provider, "
            f"batch shapes {args.batch_shapes}, cuDNN search {args.cudnn_conv_algo_search}, warm-up {warmup}; "
            f"ready after {ready_s:.1f} s"
        )
        for line in (folder / "gateway.log").read_text().splitlines():
            if "GPU executor" in line or "profile l(b)" in line:
                print("  log:", line.split("] ", 1)[-1] if "] " in line else line)
        for name, rows in results.items():
            admin = requests.get(f"{base}/admin/models/{name}", timeout=10).json()
            statuses: dict[int, int] = {}
            places: dict[str, int] = {}
            for status, where, _ in rows:
                statuses[status] = statuses.get(status, 0) + 1
                places[where] = places.get(where, 0) + 1
            ok = np.asarray([ms for status, _, ms in rows if status == 200]) if rows else np.zeros(1)
            profiles = {d: f"l(b) = {p['per_item_ms']:.3f} b + {p['fixed_ms']:.3f} ms" for d, p in admin["profiles"].items()}
            print(
                f"{name}: SLA {admin['sla_ms']:g} ms, {len(rows)} requests, statuses {statuses}, ran on {places}, "
                f"p50 {np.percentile(ok, 50):.2f} ms, p99 {np.percentile(ok, 99):.2f} ms, "
                f"executors {[(e['id'], e['provider']) for e in admin['executors']]}, profiles {profiles}"
            )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
