"""How CPU executors share a queue with a deferring GPU, side by side (DESIGN.md, open questions).

    .venv/bin/python benchmarks/gpu_cpu_sharing.py [--rate 300] [--seconds 30]

One model (upconv_m, about 5 ms a request on one core), one CPU executor (1 core) and one
emulated GPU with a strong batching effect (l(b) = 0.5 b + 8 ms, answering zeros so that the
emulation costs no CPU), served by `gateway serve`
with the default GPU policy, under the same open-loop Poisson load, twice:

- spill (ours): the CPU takes only the requests that the GPU's projected capacity cannot finish
  by their deadline;
- greedy: the CPU takes any queued request as soon as it is free (work-conserving).

Reports the share of requests answered within the SLA, the mean GPU batch, where requests ran,
and the mean and p99 response time.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gateway_ready import wait_ready

from schedulers.gpu import DEFAULT_POLICY

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = ROOT / "examples" / "models" / "upconv_m.onnx"
SLA_MS = 50.0


def run(sharing: str, rate: float, seconds: float) -> dict:
    import asyncio

    import aiohttp

    folder = Path(tempfile.mkdtemp(prefix="sharing-"))
    (folder / "profile.csv").write_text("model,alpha_ms,beta_ms\nupconv_m,0.5,8.0\n")
    port = 19000 + random.Random().randrange(500)
    (folder / "config.toml").write_text(
        f"""
[server]
port = {port}
model_dir = "{MODEL.parent}"
[node]
cpu_cores = 1.0
gpus = [0]
[gpu]
executor = "emulated"
profile = "{folder / "profile.csv"}"
policy = "{DEFAULT_POLICY}"
cpu_sharing = "{sharing}"
emulated_outputs = "zeros"
[models.upconv_m]
path = "{MODEL}"
sla_ms = {SLA_MS}
max_batch_size = 32
cpu = {{ cores = 1.0, threads = 1 }}
"""
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", str(folder / "config.toml"), "--log-level", "WARNING"], cwd=ROOT
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, process, timeout_s=60)
        body = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}).encode()
        latencies: list[float] = []
        where: list[str] = []
        batches: list[int] = []

        async def drive() -> None:
            rng = random.Random(3)
            async with aiohttp.ClientSession() as session:

                async def one() -> None:
                    started = time.monotonic()
                    async with session.post(
                        f"{base}/v2/models/upconv_m/infer", data=body, headers={"Content-Type": "application/json"}
                    ) as r:
                        answer = await r.json()
                    latencies.append((time.monotonic() - started) * 1000)
                    parameters = answer.get("parameters", {})
                    where.append(parameters.get("executed_on", f"error {r.status}"))
                    if parameters.get("executed_on", "").startswith("gpu"):
                        batches.append(parameters["batch_size"])

                tasks = []
                start, t = time.monotonic(), 0.0
                while t < seconds:
                    t += rng.expovariate(rate)
                    await asyncio.sleep(max(0.0, start + t - time.monotonic()))
                    tasks.append(asyncio.create_task(one()))
                await asyncio.gather(*tasks)

        asyncio.run(drive())
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    lat = np.asarray(latencies)
    return {
        "sharing": sharing,
        "requests": len(lat),
        "within_sla": float((lat <= SLA_MS).mean()),
        "mean_ms": float(lat.mean()),
        "p99_ms": float(np.percentile(lat, 99)),
        "gpu_share": where.count("gpu:0") / len(where),
        "cpu_share": where.count("cpu") / len(where),
        "gpu_batch_mean": float(np.mean(batches)) if batches else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=300.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    rows = [run(sharing, args.rate, args.seconds) for sharing in ("spill", "greedy")]
    print("| CPU sharing | requests | within SLA | mean ms | p99 ms | on GPU | on CPU | GPU batch mean |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['sharing']} | {r['requests']} | {r['within_sla']:.3f} | {r['mean_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['gpu_share']:.2f} | {r['cpu_share']:.2f} | {r['gpu_batch_mean']:.1f} |"
        )
    (HERE / "work").mkdir(exist_ok=True)
    (HERE / "work" / "gpu_cpu_sharing.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
