"""ROMA's GC enforced (Section 3, Algorithm 2): the cores reserved to feed the GPUs are the GPU
executors' CPU quota, shared evenly, each in a cgroup of its own; with none reserved the GPU
executors are not capped. A real `gateway serve` with emulated GPUs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from executors.limits import CFS_PERIOD_US, Hierarchy, unavailable_reason
from tests.helpers import run_gateway

needs_cgroup = pytest.mark.skipif(unavailable_reason("cpu") is not None, reason=unavailable_reason("cpu") or "")


def write_config(folder: Path, example_models: Path, *, gpus: str, reserved_cores: float) -> Path:
    shutil.copy(example_models / "mlp.onnx", folder / "mlp.onnx")
    (folder / "gpu.csv").write_text("model,alpha_ms,beta_ms\nmlp,0.5,20.0\n")
    path = folder / "config.toml"
    path.write_text(
        f"""
[node]
cpu_cores = 2.0
gpus = {gpus}

[gpu]
executor = "emulated"
profile = "gpu.csv"
emulated_outputs = "zeros"

[control]
policy = "fixed"
actuator = "cgroup"
reserved_cores = {reserved_cores}

[models.mlp]
path = "mlp.onnx"
sla_ms = 100
max_batch_size = 8
cpu = {{ cores = 1.0, threads = 1 }}
"""
    )
    return path


def cpu_quota(group: Path, v2: bool) -> int:
    """The group's CFS quota in us (-1: none), from cpu.cfs_quota_us (v1) or cpu.max (v2)."""
    if v2:
        quota, period = (group / "cpu.max").read_text().split()
        assert int(period) == CFS_PERIOD_US
        return -1 if quota == "max" else int(quota)
    assert int((group / "cpu.cfs_period_us").read_text()) == CFS_PERIOD_US
    return int((group / "cpu.cfs_quota_us").read_text())


@needs_cgroup
@pytest.mark.parametrize(("gpus", "count"), [("[0]", 1), ("[0, 1]", 2)])
def test_reserved_cores_are_the_gpu_executors_quota(tmp_path, example_models, gpus, count):
    hierarchy = Hierarchy.find("cpu")
    with run_gateway(write_config(tmp_path, example_models, gpus=gpus, reserved_cores=0.5)) as gateway:
        executors = {e["id"]: e for e in gateway.admin("mlp")["executors"]}
        base = hierarchy.root / f"gateway-{gateway.process.pid}"
        for device_id in range(count):
            described = executors[f"gpu-{device_id}"]
            assert described["cores"] == pytest.approx(0.5 / count)
            assert described["enforced_cores"] == pytest.approx(0.5 / count)
            assert described["actuator"] == hierarchy.name
            group = base / f"gpu-{device_id}"
            assert cpu_quota(group, hierarchy.v2) == round(0.5 / count * CFS_PERIOD_US)
            assert str(described["pid"]) in (group / "cgroup.procs").read_text().split()
        # The model's CPU executor keeps its own group and quota.
        assert cpu_quota(base / "cpu-mlp", hierarchy.v2) == CFS_PERIOD_US


@needs_cgroup
def test_without_reserved_cores_the_gpu_executor_is_not_capped(tmp_path, example_models):
    hierarchy = Hierarchy.find("cpu")
    with run_gateway(write_config(tmp_path, example_models, gpus="[0]", reserved_cores=0)) as gateway:
        (gpu,) = [e for e in gateway.admin("mlp")["executors"] if e["id"] == "gpu-0"]
        assert gpu["actuator"] is None and gpu["cores"] == 0.0
        group = hierarchy.root / f"gateway-{gateway.process.pid}" / "gpu-0"
        assert not group.exists() or cpu_quota(group, hierarchy.v2) == -1
        # The CPU executor is capped all the same: the cgroup works here.
        assert cpu_quota(group.parent / "cpu-mlp", hierarchy.v2) == CFS_PERIOD_US
