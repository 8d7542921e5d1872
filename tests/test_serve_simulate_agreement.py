"""`gateway serve` and `gateway simulate` run one dispatch core: the same arrivals, the same split.

One model (the MLP), one CPU executor at one core, one emulated GPU that answers zeros after
l(b) = 4 b + 40 ms (batches of up to 8: 111 requests/s at most), 150 requests/s of Poisson
arrivals for 8 s. The GPU cannot serve them all, so the CPU takes what the GPU's projection
cannot finish in time (the spill). The same arrival times then go through `gateway simulate
--config` with the CPU profile the gateway measured. Each side's share of requests served on
the GPU must agree within TOLERANCE: the HTTP path adds about a millisecond to every arrival
and real executors jitter, so the two runs cannot match request for request.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from tests.helpers import ROOT, run_gateway

RATE, SECONDS, SLA_MS = 150.0, 8.0, 150.0
GPU_PER_ITEM_MS, GPU_FIXED_MS = 4.0, 40.0
TOLERANCE = 0.08  # absolute, on the share of requests served on the GPU


def write_config(folder: Path, example_models: Path) -> Path:
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    (folder / "gpu.csv").write_text(f"model,alpha_ms,beta_ms\nmlp,{GPU_PER_ITEM_MS},{GPU_FIXED_MS}\n")
    path = folder / "config.toml"
    path.write_text(
        f"""
[node]
cpu_cores = 1.0
gpus = [0]

[gpu]
executor = "emulated"
profile = "gpu.csv"
policy = "deferral"
emulated_outputs = "zeros"

[control]
policy = "fixed"

[models.mlp]
path = "mlp.onnx"
sla_ms = {SLA_MS}
max_batch_size = 8
cpu = {{ cores = 1.0, threads = 1 }}
"""
    )
    return path


async def send(base: str, arrivals: list[float]) -> list[str]:
    """Each request at its arrival time (open loop); where each one was served."""
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]})
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:

        async def one(at: float, start: float) -> str:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            async with session.post(f"{base}/v2/models/mlp/infer", data=body, headers={"Content-Type": "application/json"}) as r:
                answer = await r.json()
                assert r.status == 200, answer
                return answer["parameters"]["executed_on"]

        start = time.perf_counter() + 0.2
        return await asyncio.gather(*(one(at, start) for at in arrivals))


def test_serve_and_simulate_serve_the_same_requests_on_each_device(tmp_path, example_models):
    config = write_config(tmp_path, example_models)
    rng = random.Random(7)
    arrivals, t = [], 0.0
    while (t := t + rng.expovariate(RATE)) < SECONDS:
        arrivals.append(t)
    with run_gateway(config) as gateway:
        served = asyncio.run(send(gateway.base, arrivals))
        cpu_profile = gateway.admin("mlp")["profiles"]["cpu"]
        time.sleep(1.1)  # a control period: the executors' CPU time is read once a period
        metrics = gateway.metrics()
    # The GPU executor's own CPU is reported apart from the models' core-seconds (issue bug 5).
    (gpu_cpu,) = [line for line in metrics.splitlines() if line.startswith('gateway_executor_cpu_seconds{device="gpu:0"')]
    assert float(gpu_cpu.split()[-1]) > 0
    served_gpu = sum(device.startswith("gpu") for device in served) / len(served)

    (tmp_path / "arrivals.json").write_text(json.dumps([[at, "mlp"] for at in arrivals]))
    output = tmp_path / "simulated.json"
    subprocess.run(
        [
            sys.executable, "-m", "gateway.cli", "simulate",
            "--config", str(config),
            "--arrivals", str(tmp_path / "arrivals.json"),
            "--cpu-profile", f"mlp={cpu_profile['per_item_ms']},{cpu_profile['fixed_ms']}",
            "--output", str(output),
        ],
        check=True,
        cwd=ROOT,
    )  # fmt: skip
    (simulated,) = json.loads(output.read_text())
    counts = simulated["models"]["mlp"]["served_on"]
    simulated_gpu = counts["gpu"] / (counts["gpu"] + counts["cpu"])
    print(f"served on the GPU: serve {served_gpu:.3f}, simulate {simulated_gpu:.3f} of {len(arrivals)} requests")
    # Both sides really split the load: the GPU alone cannot serve 150 requests/s.
    assert 0.3 < simulated_gpu < 0.95
    assert abs(served_gpu - simulated_gpu) <= TOLERANCE
