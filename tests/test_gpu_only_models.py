"""A model served on the GPUs only (``cpu_executor = false``) beside a model with its CPU executor.

The gateway runs one emulated GPU that answers zeros. ``gpu_only`` has no CPU executor: the GPU
alone serves it, and what the GPU cannot finish within the SLA is refused (``drop_late``), never
spilled to a CPU. ``mlp`` keeps its CPU executor, the node's whole CPU and its controller.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import psutil
import pytest
import requests

from gateway.config import load_config
from gateway.control import ControlLoop
from gateway.protocol import InvalidRequest
from gateway.tools.simulate import simulate_config
from supervisor.node import Window
from tests.helpers import ROOT, metric_value, run_gateway

# gpu_only's emulated l(b) = 1 b + 40 ms in batches of at most 2: about 47 requests/s, so a
# burst of BURST requests sent at once cannot all be answered within its 300 ms SLA. At 100 ms,
# taking in the burst on a busy two-core machine (the client beside the gateway) delayed the
# first batches past their latest start and every request was refused (on the developers' VM
# beside two or three busy processes, two runs in seven; on a CI machine once).
GPU_PROFILE = "model,alpha_ms,beta_ms\ngpu_only,1.0,40.0\nmlp,0.5,20.0\n"
BURST = 200
CONTROL_PERIOD_S = 0.1
BODY = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]}


def write_config(folder: Path, example_models: Path, gpus: str = "[0]") -> Path:
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    (folder / "gpu.csv").write_text(GPU_PROFILE)
    path = folder / "config.toml"
    # A request timeout well under the default minute: a request that is neither served nor
    # refused would show as a 504 instead of holding the test up.
    path.write_text(
        f"""
[server]
request_timeout_ms = 5000

[node]
cpu_cores = 1.0
gpus = {gpus}

[gpu]
executor = "emulated"
profile = "gpu.csv"
emulated_outputs = "zeros"

[control]
policy = "pi"
period_s = {CONTROL_PERIOD_S}

[models.gpu_only]
path = "mlp.onnx"
sla_ms = 300
max_batch_size = 2
drop_late = true
cpu_executor = false

[models.mlp]
path = "mlp.onnx"
sla_ms = 100
max_batch_size = 8
"""
    )
    return path


@pytest.fixture(scope="module")
def config(tmp_path_factory, example_models) -> Path:
    return write_config(tmp_path_factory.mktemp("gpu_only"), example_models)


@pytest.fixture(scope="module")
def gateway(config):
    with run_gateway(config) as gateway:
        yield gateway


async def burst(base: str, model: str, count: int) -> list[tuple[int, dict]]:
    """``count`` requests sent at once; each one's status and body."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=count)) as session:

        async def one() -> tuple[int, dict]:
            async with session.post(f"{base}/v2/models/{model}/infer", json=BODY) as response:
                return response.status, await response.json()

        return await asyncio.gather(*(one() for _ in range(count)))


def worker_processes(gateway) -> list[psutil.Process]:
    children = psutil.Process(gateway.process.pid).children(recursive=True)
    return [p for p in children if "executors.worker" in p.cmdline()]


def test_a_gpu_only_model_has_no_cpu_executor(gateway):
    gpu_only, mlp = gateway.admin("gpu_only"), gateway.admin("mlp")
    assert [e["device"] for e in gpu_only["executors"]] == ["gpu:0"]
    assert [e["device"] for e in mlp["executors"]] == ["cpu", "gpu:0"]
    assert set(gpu_only["profiles"]) == {"gpu"} and set(mlp["profiles"]) == {"cpu", "gpu"}
    assert gpu_only["ready"] is True
    assert requests.get(f"{gateway.base}/v2/models/gpu_only/ready", timeout=10).status_code == 200
    assert requests.get(f"{gateway.base}/v2/health/ready", timeout=10).status_code == 200
    # Two executor processes: mlp's CPU executor and the GPU's; none started for gpu_only.
    pids = {e["pid"] for e in mlp["executors"]}
    assert {p.pid for p in worker_processes(gateway)} == pids
    log = gateway.output()
    assert sorted(re.findall(r"executor (\S+): started process", log)) == ["cpu-mlp", "gpu-0"]
    # The node's one core is mlp's alone: gpu_only takes no share of it.
    assert re.search(r"executor cpu-mlp \(process, pid \d+, 1\.00 cores", log), log
    assert requests.get(f"{gateway.base}/admin/node", timeout=10).json()["cores"]["gpu_only"] == 0
    # No cores to pin.
    pinned = requests.put(f"{gateway.base}/admin/models/gpu_only/cores", json={"cores": 0.5}, timeout=10)
    assert pinned.status_code == 400 and "no CPU executor" in pinned.json()["error"]


def test_a_gpu_only_model_is_served_on_the_gpu_and_refuses_what_cannot_finish(gateway):
    one = requests.post(f"{gateway.base}/v2/models/gpu_only/infer", json=BODY, timeout=10)
    assert one.status_code == 200, one.text
    answer = one.json()
    assert answer["parameters"]["executed_on"] == "gpu:0"
    assert not np.asarray(answer["outputs"][0]["data"]).any()  # the emulated GPU's zeros

    answers = asyncio.run(burst(gateway.base, "gpu_only", BURST))
    statuses = [status for status, _ in answers]
    served = [body for status, body in answers if status == 200]
    refused = [body for status, body in answers if status == 503]
    # Every request ends served or refused: none waits for its timeout, none runs on a CPU.
    assert len(served) + len(refused) == BURST, sorted(set(statuses))
    assert served and refused
    assert {body["parameters"]["executed_on"] for body in served} == {"gpu:0"}
    assert all("SLA" in body["error"] for body in refused), refused[0]

    stats = gateway.admin("gpu_only")["stats"]
    assert stats["outcomes"] == {"success": len(served) + 1, "refused_deadline": len(refused)}
    assert stats["served_on"] == {"gpu:0": len(served) + 1}
    assert stats["core_seconds"] == 0
    metrics = gateway.metrics()
    assert metric_value(metrics, "gateway_requests_total", model="gpu_only", outcome="success") == len(served) + 1
    assert metric_value(metrics, "gateway_requests_total", model="gpu_only", outcome="refused_deadline") == len(refused)
    assert 'gateway_executor_cores{model="gpu_only"' not in metrics
    assert metric_value(metrics, "gateway_core_seconds_total", model="gpu_only") == 0

    # The model with its CPU executor serves as before.
    mlp = requests.post(f"{gateway.base}/v2/models/mlp/infer", json=BODY, timeout=10)
    assert mlp.status_code == 200, mlp.text


def test_the_control_loop_runs_beside_a_gpu_only_model(gateway):
    time.sleep(10 * CONTROL_PERIOD_S)
    history = requests.get(f"{gateway.base}/admin/models/mlp/history", timeout=10).json()["history"]
    assert len(history) >= 5
    # gpu_only has no cores to control: it has no control periods.
    assert requests.get(f"{gateway.base}/admin/models/gpu_only/history", timeout=10).json()["history"] == []
    log = gateway.output()
    assert "control step failed" not in log and "Traceback" not in log and "unexpected error" not in log, log


@pytest.mark.parametrize("policy", ["fixed", "pi", "rules", "max", "min"])
def test_the_control_loop_leaves_a_gpu_only_model_out(config, policy):
    """Every policy controls mlp alone: the node's one core is all its to share."""
    loaded = load_config(config)
    loaded = dataclasses.replace(loaded, control=dataclasses.replace(loaded.control, policy=policy))
    granted: dict[str, float] = {}
    loop = ControlLoop(
        loaded,
        measure=lambda: {"mlp": Window(count=10, total_ms=500.0, cpu_s=0.01)},
        set_cores=granted.__setitem__,
        clock=lambda: 0.0,
    )
    assert set(loop.initial_cores) == {"mlp"}
    if policy in ("fixed", "max"):
        assert loop.initial_cores["mlp"] == 1.0
    for period in range(1, 4):
        assert set(loop.tick(now=period * CONTROL_PERIOD_S)) == {"mlp"}
    assert set(granted) == {"mlp"}
    with pytest.raises(InvalidRequest, match="no CPU executor"):
        loop.pin("gpu_only", 0.5)


def test_simulate_gives_a_gpu_only_model_no_cpu_executor(config):
    arrivals = [(0.001 * i, model) for i in range(100) for model in ("gpu_only", "mlp")]
    result = simulate_config(config, arrivals, cpu_profiles={"mlp": (0.05, 0.3)})
    gpu_only, mlp = result["models"]["gpu_only"], result["models"]["mlp"]
    # The burst is beyond the GPU: mlp's CPU executor takes some, gpu_only has none and refuses.
    assert mlp["served_on"]["cpu"] > 0
    assert gpu_only["served_on"]["cpu"] == 0 and gpu_only["refused_deadline"] > 0
    with pytest.raises(SystemExit, match="gpu_only: no CPU executor"):
        simulate_config(config, arrivals, cpu_profiles={"gpu_only": (0.05, 0.3)})


def test_a_gpu_only_model_on_a_node_without_gpus_stops_serve(tmp_path, example_models):
    path = write_config(tmp_path, example_models, gpus="[]")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.returncode != 0
    assert f"{path}: models.gpu_only.cpu_executor: false needs GPUs (node.gpus)" in done.stderr


def test_a_repository_model_loads_beside_emulated_gpus(gateway, config):
    """A model loaded at run time is served by its CPU executor alone, yet the load was refused 400
    "gpu.csv has no row 'solo'" on a node with emulated GPUs."""
    (config.parent / "solo" / "1").mkdir(parents=True)
    shutil.copy(config.parent / "mlp.onnx", config.parent / "solo" / "1" / "model.onnx")
    loaded = requests.post(f"{gateway.base}/v2/repository/models/solo/load", timeout=120)
    assert loaded.status_code == 200, loaded.text
    try:
        served = requests.post(f"{gateway.base}/v2/models/solo/infer", json=BODY, timeout=30)
        assert served.status_code == 200 and served.json()["parameters"]["executed_on"] == "cpu", served.text
    finally:
        requests.post(f"{gateway.base}/v2/repository/models/solo/unload", timeout=60)


def test_a_gpu_only_model_has_no_cpu_batch_to_plan(gateway):
    """PUT dispatch_batch on a model without a CPU executor answered 200 and changed nothing (only
    CPU batches read it); its cores route already said why it has none."""
    refused = requests.put(f"{gateway.base}/admin/models/gpu_only/dispatch_batch", json={"dispatch_batch": 2}, timeout=10)
    assert refused.status_code == 400, refused.text
    assert "has no CPU executor (cpu_executor = false): no CPU batch to plan" in refused.json()["error"]
    planned = requests.put(f"{gateway.base}/admin/models/mlp/dispatch_batch", json={"dispatch_batch": 2}, timeout=10)
    assert planned.status_code == 200, planned.text
    requests.put(f"{gateway.base}/admin/models/mlp/dispatch_batch", json={"dispatch_batch": 1}, timeout=10)
