"""A CPU quota really caps an executor: its CPU time over wall time, measured from the OS; and the
cores counted are those enforced (the CFS floor, affinity's whole CPUs), not those granted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import psutil
import pytest
import requests

from executors.container import DockerBackend, DockerExecutor
from executors.limits import (
    CFS_PERIOD_US,
    MAX_CFS_PERIOD_US,
    MIN_QUOTA_US,
    AffinityActuator,
    Hierarchy,
    cfs_bandwidth,
    make_actuator,
    quota_cores,
    unavailable_reason,
)
from executors.process import ProcessExecutor
from tests.helpers import busy_model, ended_pid, kill_hard, run_gateway, write_config

needs_cgroup = pytest.mark.skipif(unavailable_reason("cpu") is not None, reason=unavailable_reason("cpu") or "")

BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


async def flood(url: str, seconds: float, clients: int = 8) -> int:
    """Keep the executor's queue full for ``seconds``; returns how many requests succeeded."""
    ok = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def client() -> None:
            nonlocal ok
            while time.monotonic() < deadline:
                async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as response:
                    await response.read()
                    ok += response.status == 200

        await asyncio.gather(*(client() for _ in range(clients)))
    return ok


async def measured_cores(pid: int, url: str, seconds: float = 4.0) -> float:
    process = psutil.Process(pid)
    load = asyncio.create_task(flood(url, seconds + 1.5))
    await asyncio.sleep(1.0)  # let the queue fill
    before, started = process.cpu_times(), time.monotonic()
    await asyncio.sleep(seconds)
    after, elapsed = process.cpu_times(), time.monotonic() - started
    assert await load > 0
    return (after.user + after.system - before.user - before.system) / elapsed


@needs_cgroup
async def test_half_a_core_caps_a_busy_executor_and_a_resize_lifts_it_live(tmp_path):
    busy_model(tmp_path / "busy.onnx")
    (tmp_path / "config.toml").write_text(
        """
[node]
cpu_cores = 2

[control]
policy = "fixed"
actuator = "cgroup"

[models.busy]
path = "busy.onnx"
sla_ms = 1000
max_batch_size = 4
cpu = { cores = 0.5, threads = 2, max_cores = 2 }
"""
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        url = f"{gateway.base}/v2/models/busy/infer"
        pid = gateway.executor_pid("busy")
        capped = await measured_cores(pid, url)
        assert 0.4 < capped < 0.6, capped

        response = requests.put(f"{gateway.base}/admin/models/busy/cores", json={"cores": 1.5}, timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["executors"][0]["cores"] == 1.5
        lifted = await measured_cores(pid, url)
        assert lifted > 0.9, lifted
        assert gateway.executor_pid("busy") == pid  # resized, not restarted


def python_process(code: str):
    """A fixture: a Python process running ``code``, killed at the end of the test."""

    @pytest.fixture
    def fixture():
        process = subprocess.Popen([sys.executable, "-c", code])
        yield process
        process.kill()
        process.wait()

    return fixture


sleeper = python_process("import time; time.sleep(60)")
spinner = python_process("while True: pass")  # would use a whole core


def cpu_share(pid: int, seconds: float) -> float:
    """The CPU time ``pid`` used over ``seconds`` of wall time."""
    process = psutil.Process(pid)
    before, started = process.cpu_times(), time.monotonic()
    time.sleep(seconds)
    after, elapsed = process.cpu_times(), time.monotonic() - started
    return (after.user + after.system - before.user - before.system) / elapsed


@needs_cgroup
def test_a_grant_under_a_tenth_of_a_core_is_enforced_over_a_longer_period(spinner):
    # At the 10 ms period the kernel's least quota, 1 ms, is 0.1 core: 0.05 core gets that 1 ms
    # every 20 ms instead, and a process that would spin a whole core uses 0.05 of one.
    actuator = make_actuator("cgroup")
    assert CFS_PERIOD_US == 10_000

    def bandwidth() -> list[int]:
        group = actuator.hierarchy.group("cpu-tiny").path
        if actuator.hierarchy.v2:
            return [int(v) for v in (group / "cpu.max").read_text().split()]
        return [int((group / "cpu.cfs_quota_us").read_text()), int((group / "cpu.cfs_period_us").read_text())]

    try:
        actuator.attach("cpu-tiny", spinner.pid)
        assert actuator.apply("cpu-tiny", 0.05) == pytest.approx(0.05)
        assert bandwidth() == [MIN_QUOTA_US, 20_000]
        used = cpu_share(spinner.pid, 3.0)
        assert 0.03 < used < 0.075, used  # 0.1 where the period stayed 10 ms
        # Past the kernel's own 100 ms period the 1 ms quota is the floor: 0.01 core.
        assert actuator.apply("cpu-tiny", 0.004) == pytest.approx(0.01)
        assert bandwidth() == [MIN_QUOTA_US, MAX_CFS_PERIOD_US]
        # From 0.1 core up, the configured period and the quota as granted.
        assert actuator.apply("cpu-tiny", 0.3) == pytest.approx(0.3)
        assert bandwidth() == [3_000, CFS_PERIOD_US]
        assert str(spinner.pid) in (actuator.hierarchy.group("cpu-tiny").path / "cgroup.procs").read_text().split()
    finally:
        spinner.kill()
        spinner.wait()  # a group holding a process cannot be removed
        actuator.close()
    assert not actuator.hierarchy.base.exists()


@needs_cgroup
def test_the_groups_of_ended_gateways_go_and_the_others_stay(sleeper):
    hierarchy = Hierarchy.find("cpu")
    left = hierarchy.root / f"gateway-{ended_pid()}" / "cpu-mlp"  # a gateway killed, and its executor with it
    running = hierarchy.root / f"gateway-{sleeper.pid}" / "cpu-mlp"  # a running process of that pid: not touched
    held = hierarchy.root / f"gateway-{ended_pid()}" / "cpu-cnn"  # an executor that outlived its gateway
    # A gateway of another PID namespace (a container's): whether its pid runs cannot be told here.
    elsewhere = hierarchy.root / f"gateway-{ended_pid()}-ns12345" / "cpu-mlp"
    try:
        for group in (left, running, held, elsewhere):
            group.mkdir(parents=True)
        (held / "cgroup.procs").write_text(str(sleeper.pid))
        assert hierarchy.remove_ended_gateways() >= 1
        assert not left.parent.exists()
        assert running.is_dir() and held.is_dir() and elsewhere.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()  # a group holding a process cannot be removed
        for group in (left, running, held, elsewhere):
            with contextlib.suppress(OSError):
                group.rmdir()
                group.parent.rmdir()


@needs_cgroup
def test_a_gateway_removes_at_start_the_groups_a_killed_one_left(tmp_path):
    # SIGKILL leaves the gateway no chance to remove its groups; its executors end with it (their
    # connection closes), and the next gateway on the node removes what they left.
    busy_model(tmp_path / "busy.onnx")
    config = write_config(tmp_path / "config.toml", {"busy": {"path": "busy.onnx", "sla_ms": 100}})
    with run_gateway(config) as crashed:
        groups = Hierarchy.find("cpu").root / f"gateway-{crashed.process.pid}"
        assert (groups / "cpu-busy").is_dir()
        kill_hard(crashed, "busy")
        assert (groups / "cpu-busy").is_dir()  # left behind by the crash
    with run_gateway(config) as gateway:
        assert not groups.exists()  # removed at start
        assert (groups.parent / f"gateway-{gateway.process.pid}" / "cpu-busy").is_dir()


def test_the_cfs_bandwidth_keeps_the_period_where_the_quota_fits_it():
    assert cfs_bandwidth(0.5, 10_000) == (5_000, 10_000)
    assert cfs_bandwidth(0.1, 10_000) == (1_000, 10_000)
    assert cfs_bandwidth(0.05, 10_000) == (1_000, 20_000)
    assert cfs_bandwidth(0.03, 10_000) == (1_000, 33_334)
    assert cfs_bandwidth(0.0, 10_000) == (1_000, MAX_CFS_PERIOD_US)
    assert cfs_bandwidth(0.005, 10_000) == (1_000, MAX_CFS_PERIOD_US)
    assert cfs_bandwidth(5e-324, 10_000) == (1_000, MAX_CFS_PERIOD_US)  # 1 ms over it would be infinite
    # A configured period longer than the stretch is never shortened.
    assert cfs_bandwidth(0.005, 500_000) == (2_500, 500_000)
    assert quota_cores(0.05, 10_000) == pytest.approx(0.05)
    assert quota_cores(0.005, 10_000) == pytest.approx(0.01)


def test_quotas_that_fill_the_node_add_up_to_no_more_than_its_cores():
    """Rounded to nearest, three grants of 2/3 core on a node of 2 were enforced as 2.0001."""
    assert cfs_bandwidth(2 / 3, 100_000) == (66_666, 100_000)
    assert sum(quota_cores(cores, 100_000) for cores in [2 / 3] * 3) <= 2.0
    assert sum(quota_cores(cores, 10_000) for cores in [2 / 7] * 7) <= 2.0
    # A product just under a whole microsecond in floats is that microsecond, not one less.
    assert 0.29 * 100_000 < 29_000 and cfs_bandwidth(0.29, 100_000) == (29_000, 100_000)


def test_cpu_affinity_counts_the_whole_cpus_it_pins(sleeper):
    actuator = AffinityActuator()
    available = len(psutil.Process().cpu_affinity())
    actuator.attach("cpu-a", sleeper.pid)
    assert actuator.apply("cpu-a", 0.3) == 1.0
    assert len(psutil.Process(sleeper.pid).cpu_affinity()) == 1
    assert actuator.apply("cpu-a", 1.5) == min(2.0, available)
    assert len(psutil.Process(sleeper.pid).cpu_affinity()) == min(2, available)
    assert actuator.apply("cpu-a", available + 3) == available


def test_cpu_affinity_pins_a_process_attached_after_its_cpus_were_given(sleeper):
    """A quota is written before a process joins its group; the CPUs are given before the process
    is attached alike, and attached, it was not pinned (it ran on every CPU until the next grant)."""
    actuator = AffinityActuator()
    assert actuator.apply("cpu-a", 0.3) == 1.0
    actuator.attach("cpu-a", sleeper.pid)
    assert len(psutil.Process(sleeper.pid).cpu_affinity()) == 1


second_sleeper = python_process("import time; time.sleep(60)")


def test_cpu_affinity_spreads_executors_over_the_cpus(sleeper, second_sleeper):
    """Each executor was pinned to the first CPUs: two of 0.9 cores each both ran on CPU 0, so
    the 1 + 1 enforced cores counted were one CPU's worth."""
    available = psutil.Process().cpu_affinity()
    if len(available) < 2:
        pytest.fail("this test needs a process that may run on two CPUs")
    actuator = AffinityActuator()
    actuator.attach("cpu-a", sleeper.pid)
    actuator.attach("cpu-b", second_sleeper.pid)
    assert actuator.apply("cpu-a", 0.9) == actuator.apply("cpu-b", 0.9) == 1.0
    first, second = psutil.Process(sleeper.pid).cpu_affinity(), psutil.Process(second_sleeper.pid).cpu_affinity()
    assert len(first) == len(second) == 1 and first != second
    actuator.detach("cpu-a")  # its CPU is free again: the next executor is given it
    actuator.attach("cpu-a", sleeper.pid)
    actuator.apply("cpu-a", 0.5)
    assert psutil.Process(sleeper.pid).cpu_affinity() != second


def test_an_executor_reports_the_cores_its_actuator_will_enforce(tmp_path):
    def executor(**options) -> ProcessExecutor:
        return ProcessExecutor("cpu-m", {"m": Path("m.onnx")}, device="cpu", threads=1, socket_dir=tmp_path, **options)

    assert executor(cores=0.05).enforced_cores == 0.05  # nothing enforces it: the grant
    assert executor(cores=0.3, actuator=AffinityActuator()).enforced_cores == 1.0
    if unavailable_reason("cpu") is None:
        actuator = make_actuator("cgroup")
        try:
            tiny = executor(cores=0.005, actuator=actuator)
            assert tiny.enforced_cores == pytest.approx(0.01)
            tiny.set_cores(0.05)
            assert tiny.enforced_cores == pytest.approx(0.05)
            tiny.set_cores(0.5)
            assert tiny.enforced_cores == pytest.approx(0.5)
        finally:
            actuator.close()
    backend = DockerBackend()  # no daemon needed: nothing is started
    try:
        container = DockerExecutor(
            "cpu-m", {"m": Path("m.onnx")}, device="cpu", threads=1, cores=0.005, socket_dir=tmp_path, docker_backend=backend
        )
        assert container.enforced_cores == pytest.approx(0.01)  # Docker's quota has the same 1 ms floor
    finally:
        backend.close()


async def test_a_few_small_requests_read_their_cpu_time_finer_than_the_kernels_10_ms_ticks(tmp_path, example_models):
    # A request of the MLP takes well under a millisecond of CPU: counted in the kernel's
    # 10 ms ticks (what psutil reads from /proc), five of them read 0 or 10 ms; as the
    # executor reports it, a few milliseconds at most, and never a whole number of ticks.
    actuator = make_actuator("auto")
    models = {"mlp": example_models / "mlp.onnx"}
    executor = ProcessExecutor("cpu-mlp", models, device="cpu", threads=1, cores=1.0, socket_dir=tmp_path, actuator=actuator)
    try:
        await executor.start()
        x = np.random.default_rng(0).random((1, 512), dtype=np.float32)
        await executor.infer("mlp", {"x": x})
        before = executor.cpu_seconds()
        for _ in range(5):
            await executor.infer("mlp", {"x": x})
        used = executor.cpu_seconds() - before
        assert 0 < used < 0.009, used
        ticks = used / 0.01
        assert abs(ticks - round(ticks)) > 1e-6, used
    finally:
        await executor.stop()
        actuator.close()


async def test_a_process_executor_reports_the_cpu_time_it_used(tmp_path, example_models):
    actuator = make_actuator("auto")
    models = {"mlp": example_models / "mlp.onnx"}
    executor = ProcessExecutor("cpu-mlp", models, device="cpu", threads=1, cores=1.0, socket_dir=tmp_path, actuator=actuator)
    assert executor.cpu_seconds() is None  # not started
    try:
        await executor.start()
        assert executor.enforced_cores == 1.0
        before = executor.cpu_seconds()
        assert before is not None and before > 0  # loading the model took CPU
        x = np.random.default_rng(0).random((64, 512), dtype=np.float32)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            await executor.infer("mlp", {"x": x})
        after = executor.cpu_seconds()
        assert after is not None and after - before > 0.05, (before, after)
    finally:
        await executor.stop()
        actuator.close()
    assert executor.cpu_seconds() is None  # the process is gone


@needs_cgroup
def test_gateways_each_pid_1_of_a_namespace_of_its_own_keep_their_groups_apart(tmp_path):
    """Every pod of a DaemonSet runs the gateway as pid 1: two worker pods on one node of cgroup
    v1 (which see the node's hierarchy) put their executors of a model in one group,
    gateway-1/cpu-busy, under the quota of whichever set it last."""
    import os
    import shutil
    import signal

    from tests.helpers import ROOT, free_port

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    busy_model(tmp_path / "busy.onnx")
    # A running gateway's socket folder: its pid is out of sight of a gateway in a PID namespace
    # of its own, which took it for ended and removed it (every gateway's on the machine).
    import socket
    import tempfile

    live = Path(tempfile.mkdtemp(prefix=f"gateway-{os.getpid()}-"))
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(live / "cpu-mlp.sock"))
    started = []
    try:
        for cores in (0.3, 0.7):
            config = tmp_path / f"config-{cores}.toml"
            config.write_text(
                f'[control]\npolicy = "fixed"\n[models.busy]\npath = "busy.onnx"\nsla_ms = 100\ncpu = {{ cores = {cores} }}\n'
            )
            port = free_port()
            command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-m", "gateway.cli"]
            process = subprocess.Popen(
                [*command, "serve", str(config), "--port", str(port)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            started.append((process, port, cores))
        groups = []
        for process, port, cores in started:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with contextlib.suppress(requests.ConnectionError):
                    if requests.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                        break
                time.sleep(0.2)
            else:
                pytest.fail(f"the gateway on port {port} never became ready")
            (gateway,) = psutil.Process(process.pid).children()
            namespace = os.stat(f"/proc/{gateway.pid}/ns/pid").st_ino
            group = Hierarchy.find("cpu").root / f"gateway-1-ns{namespace}" / "cpu-busy"
            executors = [c.pid for c in gateway.children() if "executors.worker" in " ".join(c.cmdline())]
            assert executors and set(executors) <= set(map(int, (group / "cgroup.procs").read_text().split())), group
            assert int((group / "cpu.cfs_quota_us").read_text()) == round(cores * CFS_PERIOD_US)
            groups.append(group)
        assert groups[0] != groups[1]
        assert (live / "cpu-mlp.sock").exists()
    finally:
        shutil.rmtree(live, ignore_errors=True)
        for process, _, _ in started:
            for child in psutil.Process(process.pid).children():
                child.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    assert not any(group.parent.exists() for group in groups)
