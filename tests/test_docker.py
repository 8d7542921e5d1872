"""Docker executors with real containers: serving, a live resize, a killed container, no leftovers.

These need a Docker daemon. Without one they are skipped with the reason printed; with
GATEWAY_REQUIRE_DOCKER=1 (set by .ci/run) a missing daemon fails them instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker
import docker.errors
import numpy as np
import pytest
import requests
import tritonclient.http as triton
from docker.models.containers import ContainerCollection

import executors.lifecycle
from executors.container import LABEL, OWNER_LABEL, DockerBackend, DockerExecutor, DockerUnavailable
from executors.lifecycle import ExecutorStartError
from tests.cluster import wait_for_async
from tests.helpers import ROOT, busy_model, fixed_shape_model, run_gateway
from tests.test_executor_crash import BODY, _load
from tests.test_executor_start_deadline import KIND, delayed
from tests.test_quota import flood
from tests.test_serve_examples import direct_run


@pytest.fixture(scope="module")
def client():
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException as error:
        reason = f"no Docker daemon reachable ({error})"
        if os.environ.get("GATEWAY_REQUIRE_DOCKER") == "1":
            pytest.fail(f"GATEWAY_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    yield client
    client.close()


def docker_config(path: Path, models: str, control: str = 'policy = "fixed"') -> Path:
    path.write_text(f'[node]\ncpu_cores = 2\nexecutor_backend = "docker"\n\n[control]\n{control}\n\n{models}')
    return path


def owned_by(client: docker.DockerClient, pid: int) -> list:
    return [
        c
        for c in client.containers.list(all=True, filters={"label": OWNER_LABEL}, ignore_removed=True)
        if c.labels[OWNER_LABEL].endswith(f":{pid}")
    ]


def container_cpu_seconds(pid: int) -> float:
    """CPU time of the container's cgroup, from the kernel's counters (cgroup v1 cpuacct or v2)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, group = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return int(Path(f"/sys/fs/cgroup/cpuacct{group}/cpuacct.usage").read_text()) / 1e9
        if controllers == "":
            stat = dict(row.split() for row in Path(f"/sys/fs/cgroup{group}/cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
    raise AssertionError(f"no CPU accounting cgroup for pid {pid}")


async def container_cores(pid: int, url: str, seconds: float = 4.0) -> float:
    load = asyncio.create_task(flood(url, seconds + 1.5))
    await asyncio.sleep(1.0)  # let the queue fill
    before, started = container_cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    used = (container_cpu_seconds(pid) - before) / (time.monotonic() - started)
    assert await load > 0
    return used


def test_docker_executors_serve_through_tritonclient(client, tmp_path, example_models):
    fixed_shape_model(tmp_path / "fixed.onnx")
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    config = docker_config(
        tmp_path / "config.toml",
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 100\nmax_batch_size = 8\n\n'
        '[models.fixed]\npath = "fixed.onnx"\nsla_ms = 100\n',
    )
    with run_gateway(config) as gateway:
        triton_client = triton.InferenceServerClient(gateway.url)
        data = np.random.default_rng(3).random((2, 512), dtype=np.float32)
        for binary in (False, True):
            infer_input = triton.InferInput("x", data.shape, "FP32")
            infer_input.set_data_from_numpy(data, binary_data=binary)
            result = triton_client.infer("mlp", [infer_input])
            ((name, want),) = direct_run(example_models / "mlp.onnx", {"x": data}).items()
            assert np.allclose(result.as_numpy(name), want, rtol=1e-4, atol=1e-5)
        fixed = triton.InferInput("x", [2, 4], "FP32")
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        fixed.set_data_from_numpy(x)
        assert np.array_equal(triton_client.infer("fixed", [fixed]).as_numpy("y"), x * 2 + 1)

        for model in ("mlp", "fixed"):
            (executor,) = gateway.admin(model)["executors"]
            assert executor["backend"] == "docker" and executor["state"] == "ready"
            container = client.containers.get(executor["container"])
            assert container.status == "running"
            assert container.labels[LABEL] == f"cpu-{model}"
            assert container.attrs["HostConfig"]["NetworkMode"] == "host"
            # The executor's process is the container's: its pid (the host's) is in the container.
            assert executor["pid"] == container.attrs["State"]["Pid"]
            model_mounts = [m for m in container.attrs["Mounts"] if m["Source"].endswith(".onnx")]
            assert model_mounts and all(not m["RW"] for m in model_mounts)


async def test_a_container_resized_from_0_3_to_1_5_cores_while_serving(client, tmp_path):
    busy_model(tmp_path / "busy.onnx")
    config = docker_config(
        tmp_path / "config.toml",
        '[models.busy]\npath = "busy.onnx"\nsla_ms = 1000\nmax_batch_size = 4\n'
        "cpu = { cores = 0.3, threads = 2, min_cores = 0.05, max_cores = 2 }\n",
    )
    with run_gateway(config) as gateway:
        url = f"{gateway.base}/v2/models/busy/infer"
        (executor,) = gateway.admin("busy")["executors"]
        container = client.containers.get(executor["container"])
        assert container.attrs["HostConfig"]["CpuQuota"] == 3000 and container.attrs["HostConfig"]["CpuPeriod"] == 10000
        capped = await container_cores(executor["pid"], url)
        assert 0.2 < capped < 0.4, capped

        response = requests.put(f"{gateway.base}/admin/models/busy/cores", json={"cores": 1.5}, timeout=10)
        assert response.status_code == 200, response.text
        await resized(container, 15000)
        assert container.attrs["HostConfig"]["CpuQuota"] == 15000
        lifted = await container_cores(executor["pid"], url)
        assert lifted > 0.9, lifted
        assert lifted > 2.5 * capped
        (after,) = gateway.admin("busy")["executors"]
        assert after["container"] == executor["container"] and after["restarts"] == 0  # resized, not restarted

        # Under 0.1 core the 1 ms least quota goes over a longer period: 0.05 core, not 0.1.
        response = requests.put(f"{gateway.base}/admin/models/busy/cores", json={"cores": 0.05}, timeout=10)
        assert response.status_code == 200, response.text
        await resized(container, 1000)
        assert (container.attrs["HostConfig"]["CpuQuota"], container.attrs["HostConfig"]["CpuPeriod"]) == (1000, 20000)
        (floored,) = gateway.admin("busy")["executors"]
        assert floored["enforced_cores"] == pytest.approx(0.05)


async def resized(container, quota: int) -> None:
    """Until Docker reports ``quota`` (the update runs in a thread of the gateway's; 10 s at most)."""

    def reported() -> bool:
        container.reload()
        return container.attrs["HostConfig"]["CpuQuota"] == quota

    await wait_for_async(reported, 10, f"a CPU quota of {quota}")


async def test_a_killed_container_is_replaced_and_every_request_ends(client, tmp_path):
    busy_model(tmp_path / "busy.onnx")
    # Half a core: a batch takes tens of ms against a gap of about one, so the kill meets one in flight.
    config = docker_config(
        tmp_path / "config.toml",
        '[models.busy]\npath = "busy.onnx"\nsla_ms = 100\nmax_batch_size = 4\ncpu = { cores = 0.5, threads = 1 }\n',
    )
    with run_gateway(config) as gateway:
        (first,) = gateway.admin("busy")["executors"]
        load = asyncio.create_task(_load(gateway.base, seconds=5.0, clients=8))
        await asyncio.sleep(1.0)
        client.containers.get(first["container"]).kill()
        answers = await load  # would raise a timeout if any request hung

        statuses = [status for status, _ in answers]
        assert set(statuses) <= {200, 503}, set(statuses)
        failed = [text for status, text in answers if status == 503]
        assert failed, "a kill under load must fail the batch in flight"
        assert statuses.count(200) > len(failed)
        gateway.wait_ready("busy", timeout=30)
        (second,) = gateway.admin("busy")["executors"]
        assert second["container"] != first["container"] and second["restarts"] == 1 and second["state"] == "ready"
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(first["container"])  # the dead one is removed, not left behind
        assert requests.post(f"{gateway.base}/v2/models/busy/infer", json=BODY, timeout=10).status_code == 200
        outcomes = gateway.admin("busy")["stats"]["outcomes"]
        assert outcomes["success"] == statuses.count(200) + 1
        assert outcomes["executor_failed"] == len(failed)


def test_no_container_is_left_after_shutdown_or_after_a_start_that_follows_a_crash(client, tmp_path):
    busy_model(tmp_path / "busy.onnx")
    config = docker_config(
        tmp_path / "config.toml",
        '[models.a]\npath = "busy.onnx"\nsla_ms = 100\n\n[models.b]\npath = "busy.onnx"\nsla_ms = 100\n',
    )
    with run_gateway(config) as crashed:
        assert len(owned_by(client, crashed.process.pid)) == 2
        crashed.process.kill()  # SIGKILL: no chance to clean up
        crashed.process.wait()
        assert len(owned_by(client, crashed.process.pid)) == 2  # left behind by the crash
    with run_gateway(config) as gateway:
        assert owned_by(client, crashed.process.pid) == []  # removed at start
        assert len(owned_by(client, gateway.process.pid)) == 2
    assert gateway.process.returncode == 0
    assert owned_by(client, gateway.process.pid) == []  # removed on shutdown


def test_docker_asked_for_but_unreachable_exits_with_the_fix(tmp_path):
    """No silent fallback to processes: the message says what is wrong and how to fix it."""
    busy_model(tmp_path / "busy.onnx")
    config = docker_config(tmp_path / "config.toml", '[models.busy]\npath = "busy.onnx"\nsla_ms = 100\n')
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", str(config), "--port", "0"],
        cwd=ROOT,
        env=dict(os.environ, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "Docker daemon cannot be reached" in result.stderr
    assert "dockerd" in result.stderr and 'executor_backend = "process"' in result.stderr


def test_the_gateway_process_pid_labels_match_a_live_gateway(client, tmp_path):
    """A second gateway does not remove the containers of one that is still running."""
    busy_model(tmp_path / "busy.onnx")
    config = docker_config(tmp_path / "config.toml", '[models.busy]\npath = "busy.onnx"\nsla_ms = 100\n')
    with run_gateway(config) as first, run_gateway(config) as second:
        assert len(owned_by(client, first.process.pid)) == 1
        assert len(owned_by(client, second.process.pid)) == 1
        os.kill(first.process.pid, signal.SIGTERM)
        first.process.wait(timeout=20)
        assert owned_by(client, first.process.pid) == []
        assert second.admin("busy")["executors"][0]["state"] == "ready"


def test_a_gpu_container_without_the_nvidia_runtime_is_a_clear_error(client, tmp_path):
    if "nvidia" in client.info().get("Runtimes", {}):
        pytest.skip("this Docker daemon has the NVIDIA runtime: a GPU container would start")
    busy_model(tmp_path / "busy.onnx")
    config = tmp_path / "config.toml"
    config.write_text(
        '[node]\ncpu_cores = 2\ngpus = [0]\nexecutor_backend = "docker"\n[gpu]\nexecutor = "cuda"\n'
        '[models.busy]\npath = "busy.onnx"\nsla_ms = 100\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", str(config), "--port", "0"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    assert "needs gpu:0 in a container, but this Docker daemon has no NVIDIA runtime" in stderr
    assert owned_by(client, process.pid) == []  # the CPU executor's container went with it


@pytest.fixture
def docker_backend(client):
    backend = DockerBackend()
    backend.connect()
    yield backend
    backend.close()


async def test_a_container_printing_while_it_starts_is_waited_for(docker_backend, monkeypatch, example_models, tmp_path):
    """The container's output is followed as a process's pipe is: with a start deadline of 1 s, a
    container whose worker starts 3 s late, printing all along, is waited for; its lines reach
    the executor's output (and the gateway's log)."""
    monkeypatch.setattr(executors.lifecycle, "START_TIMEOUT_S", 1.0)
    executor = DockerExecutor(
        "slow-docker", {"mlp": example_models / "mlp.onnx"}, **KIND, socket_dir=tmp_path, docker_backend=docker_backend
    )
    delayed(executor, printing=True)
    await executor.start()
    try:
        assert executor.ready and "loading 9" in executor.output_tail
    finally:
        await executor.stop()


async def test_a_silent_container_is_given_up_after_the_start_deadline(docker_backend, monkeypatch, example_models, tmp_path):
    monkeypatch.setattr(executors.lifecycle, "START_TIMEOUT_S", 1.0)
    executor = DockerExecutor(
        "mute-docker", {"mlp": example_models / "mlp.onnx"}, **KIND, socket_dir=tmp_path, docker_backend=docker_backend
    )
    delayed(executor, printing=False)
    with pytest.raises(ExecutorStartError, match="no hello and no output for 1 s"):
        await executor.start()
    await executor.stop()


def test_a_container_removed_while_leftovers_are_listed_is_skipped(docker_backend, client, monkeypatch):
    """Two containers of a gateway that is gone; one is removed by someone else between the
    daemon's list and the SDK's look at each entry (a gateway stopping its executors as another
    starts): the start goes on and removes the other, where it failed with NotFound."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    owner = f"{socket.gethostname()}:{gone.stdout.strip()}"
    made = [
        client.containers.create(docker_backend.image, command=["true"], labels={LABEL: "test", OWNER_LABEL: owner})
        for _ in range(2)
    ]
    inspect = ContainerCollection.get
    raced: list[str] = []

    def get_after_a_removal(collection: ContainerCollection, container_id: str, *args, **kwargs):
        if not raced:
            other = next(c for c in made if c.id != container_id)
            other.remove(force=True)
            raced.append(other.name)
        return inspect(collection, container_id, *args, **kwargs)

    monkeypatch.setattr(ContainerCollection, "get", get_after_a_removal)
    try:
        removed = docker_backend.remove_leftovers()
    finally:
        monkeypatch.undo()
        for container in made:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
    assert raced and removed == [c.name for c in made if c.name not in raced]
    assert [c for c in client.containers.list(all=True, filters={"label": OWNER_LABEL}) if c.labels[OWNER_LABEL] == owner] == []


async def test_an_executor_stopped_while_its_container_is_made_leaves_none(
    docker_backend, client, monkeypatch, example_models, tmp_path
):
    """stop() cancels the coroutine that waits for the container to be made, not the pool's
    thread that makes it: the container the daemon made afterwards was left behind (an unload or
    a SIGTERM during a restart), and start() never returned."""
    from docker.models.containers import ContainerCollection

    create = ContainerCollection.create
    making = threading.Event()

    def slow_create(self, *args, **kwargs):
        making.set()
        time.sleep(1.0)  # the daemon is still making it when stop() comes
        return create(self, *args, **kwargs)

    # On the class: the client's ``containers`` is a new collection at each read, so a create set
    # on one was never called, and stop() came after a fixed 0.3 s, before or after the container
    # was ready (in a full run of the suite, after: the start went on to ready).
    monkeypatch.setattr(ContainerCollection, "create", slow_create)
    executor = DockerExecutor(
        "cut-short", {"mlp": example_models / "mlp.onnx"}, **KIND, socket_dir=tmp_path, docker_backend=docker_backend
    )
    starting = asyncio.ensure_future(executor.start())
    while not making.is_set():
        await asyncio.sleep(0.01)
    await executor.stop()
    with pytest.raises(ExecutorStartError, match="stopped"):
        await asyncio.wait_for(starting, 10)
    await asyncio.sleep(2.0)  # the thread has made the container and removed it
    assert client.containers.list(all=True, filters={"label": f"{LABEL}=cut-short"}) == []


async def test_a_daemon_out_of_reach_neither_ends_the_supervision_nor_leaves_it_restarting(
    docker_backend, client, monkeypatch, example_models, tmp_path
):
    """A daemon restarting answers the SDK with requests' ConnectionError, no DockerException:
    raised from the removal of the dead container, it ended the supervision for good (never
    restarted: ready never again, and a stop left the container behind)."""
    from docker.models.containers import Container

    executor = DockerExecutor(
        "daemon-away", {"mlp": example_models / "mlp.onnx"}, **KIND, socket_dir=tmp_path, docker_backend=docker_backend
    )
    await executor.start()
    try:
        unreachable = requests.exceptions.ConnectionError("the daemon is restarting")
        calls = {"remove": 0, "wait": 0}
        remove, wait = Container.remove, Container.wait

        def remove_once_unreachable(self, *args, **kwargs):
            calls["remove"] += 1
            if calls["remove"] == 1:
                raise unreachable
            return remove(self, *args, **kwargs)

        def wait_once_unreachable(self, *args, **kwargs):
            calls["wait"] += 1
            if calls["wait"] == 1:
                raise unreachable
            return wait(self, *args, **kwargs)

        monkeypatch.setattr(Container, "remove", remove_once_unreachable)
        monkeypatch.setattr(Container, "wait", wait_once_unreachable)
        old = executor.container
        assert old is not None
        client.containers.get(old.id).kill()
        deadline = time.monotonic() + 30
        while not (executor.ready and executor.restarts >= 1) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert executor.ready and executor.restarts >= 1, (executor.state, executor.restarts)
        assert calls["remove"] >= 1
    finally:
        await executor.stop()
        for container in client.containers.list(all=True, filters={"label": f"{LABEL}=daemon-away"}):
            container.remove(force=True)  # the first one, which the daemon "out of reach" kept


MLP_BODY = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.25] * 512}]}


def test_a_model_reloaded_again_and_again_is_served_each_time(client, tmp_path, example_models):
    """A reload's new executor named its first container as its predecessor's was named, while
    Docker was still removing that one: 409 Conflict, and the model was left unloaded (about one
    reload in three)."""
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    config = docker_config(
        tmp_path / "config.toml", '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 500\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    with run_gateway(config) as gateway:
        for attempt in range(8):
            loaded = requests.post(f"{gateway.base}/v2/repository/models/mlp/load", timeout=120)
            assert loaded.status_code == 200, (attempt, loaded.text)
            assert requests.post(f"{gateway.base}/v2/models/mlp/infer", json=MLP_BODY, timeout=30).status_code == 200
        assert len(owned_by(client, gateway.process.pid)) == 1


async def test_more_containers_than_the_pools_threads_all_become_ready(client, monkeypatch, example_models, tmp_path):
    """Each container's wait held one of the pool's threads for its life: with 64 Docker models
    the 64th executor's next call queued for ever, and the gateway never became ready (nor said
    why). Here the pool has 2 threads and 3 containers start."""
    import executors.container

    monkeypatch.setattr(executors.container, "POOL_THREADS", 2)
    backend = DockerBackend()
    backend.connect()
    started = [
        DockerExecutor(f"pool-{i}", {"mlp": example_models / "mlp.onnx"}, **KIND, socket_dir=tmp_path, docker_backend=backend)
        for i in range(3)
    ]
    try:
        for executor in started:
            await asyncio.wait_for(executor.start(), 60)
        assert all(e.ready and e.pid for e in started)
    finally:
        for executor in started:
            await executor.stop()
        backend.close()


async def test_a_model_file_missing_at_a_restart_is_waited_for_not_made_a_directory(
    docker_backend, client, example_models, tmp_path
):
    """A volume's missing source is made a directory by the daemon (owned by root): the model
    file copied back went into it, and the model never served again."""
    model = tmp_path / "models" / "mlp.onnx"
    model.parent.mkdir()
    shutil.copy(example_models / "mlp.onnx", model)
    executor = DockerExecutor("missing-file", {"mlp": model}, **KIND, socket_dir=tmp_path, docker_backend=docker_backend)
    await executor.start()
    try:
        model.unlink()
        assert executor.container is not None
        client.containers.get(executor.container.id).kill()
        await asyncio.sleep(3.0)  # restarts tried meanwhile, each refused: the file is missing
        assert not model.exists() and not executor.ready
        shutil.copy(example_models / "mlp.onnx", model)
        deadline = time.monotonic() + 60
        while not executor.ready and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert executor.ready and model.is_file() and executor.restarts >= 1
    finally:
        await executor.stop()


async def test_a_memory_limit_is_set_in_bytes_and_one_under_dockers_least_is_refused(
    docker_backend, client, example_models, tmp_path
):
    """ "0m" (memory_mb 0.5) was no limit at all to Docker; 100.9 MB was 100."""
    executor = DockerExecutor(
        "memory-bytes", {"mlp": example_models / "mlp.onnx"}, **KIND, memory_mb=200.5, socket_dir=tmp_path,
        docker_backend=docker_backend,
    )  # fmt: skip
    await executor.start()
    try:
        assert executor.container is not None
        assert client.containers.get(executor.container.id).attrs["HostConfig"]["Memory"] == int(200.5 * 2**20)
    finally:
        await executor.stop()
    tiny = DockerExecutor(
        "memory-tiny", {"mlp": example_models / "mlp.onnx"}, **KIND, memory_mb=0.5, socket_dir=tmp_path,
        docker_backend=docker_backend,
    )  # fmt: skip
    with pytest.raises((ExecutorStartError, docker.errors.APIError), match="[Mm]inimum memory limit"):
        await tiny.start()
    await tiny.stop()
    assert client.containers.list(all=True, filters={"label": f"{LABEL}=memory-tiny"}) == []


async def test_a_container_that_cannot_start_is_not_left_behind(client, example_models, tmp_path):
    """The host-runtime image has no python of its own: taken as a self-contained image, its
    container is made but does not start, and containers.run left it behind, "created"."""
    backend = DockerBackend(host_runtime=False)
    backend.connect()
    executor = DockerExecutor(
        "no-python", {"mlp": example_models / "mlp.onnx"}, **KIND, socket_dir=tmp_path, docker_backend=backend
    )
    try:
        with pytest.raises((ExecutorStartError, docker.errors.APIError), match="python"):
            await executor.start()
        await executor.stop()
        assert client.containers.list(all=True, filters={"label": f"{LABEL}=no-python"}) == []
    finally:
        backend.close()


@pytest.mark.parametrize(("image", "words"), [("Bad Image!!", "invalid reference format"), ("", "is no image name")])
def test_an_image_name_the_daemon_refuses_is_named_not_a_traceback(client, image, words):
    with pytest.raises(DockerUnavailable, match=words) as refused:
        DockerBackend(image=image).connect()
    assert f"[docker] image {image!r}" in str(refused.value)


def test_two_models_of_one_file_are_each_mounted_in_a_self_contained_image(tmp_path, example_models):
    """In a self-contained image each model is seen at /models/NAME.onnx: keyed by the host's
    path, two models of one file got one mount, and the first one's file was not in the container."""
    backend = DockerBackend(host_runtime=False)  # not connected: the mounts are the executor's own arithmetic
    executor = DockerExecutor(
        "gpu-shared", {"fast": example_models / "mlp.onnx", "slow": example_models / "mlp.onnx"}, **KIND,
        socket_dir=tmp_path, docker_backend=backend,
    )  # fmt: skip
    try:
        mounts, inside = executor._mounts()
        mounted = {m["Target"]: m["Source"] for m in mounts}
        assert {str(p) for p in inside.values()} == {"/models/fast.onnx", "/models/slow.onnx"}
        assert all(mounted[str(p)] == str((example_models / "mlp.onnx").resolve()) for p in inside.values())
    finally:
        backend.close()


def test_containers_of_another_pid_namespaces_gateway_are_left_alone(docker_backend, client, monkeypatch):
    """A gateway in a PID namespace of its own (pid 1 of a pod, or of `unshare --pid`) took a
    running host gateway's containers for an ended one's (their owner's pid was out of its
    sight) and removed them; nor may a host gateway judge a namespaced one's by its pid."""
    import executors.limits

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    host = socket.gethostname()
    owners = [f"{host}:{gone.stdout.strip()}", f"{host}:{gone.stdout.strip()}-ns12345"]
    made = [
        client.containers.create(docker_backend.image, command=["true"], labels={LABEL: "test", OWNER_LABEL: owner})
        for owner in owners
    ]
    try:
        assert docker_backend.remove_leftovers() == [made[0].name]  # from the host: its own ended gateway's only
        made[0] = client.containers.create(docker_backend.image, command=["true"], labels={LABEL: "test", OWNER_LABEL: owners[0]})
        monkeypatch.setattr(executors.limits, "pid_namespace", lambda: 4026532999)
        assert docker_backend.remove_leftovers() == []  # from a namespace of its own: none
    finally:
        monkeypatch.undo()
        for container in made:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def test_docker_image_names_a_tag_docker_refuses_in_one_line(client, capsys):
    """Docker's 400 (invalid reference format) was a traceback."""
    from gateway.cli import main

    assert main(["docker-image", "--tag", "Bad Tag"]) == 1
    said = capsys.readouterr().out
    assert said.startswith("gateway docker-image: Bad Tag not imported: ") and "invalid reference format" in said
    assert not client.images.list(name="Bad Tag")


def _quota_cores(container_id: str) -> float | None:
    """The CFS quota (cores) the kernel holds for a running container (cgroup v1 or v2), None if none."""
    for group in (
        Path(f"/sys/fs/cgroup/cpu/docker/{container_id}"),
        *Path("/sys/fs/cgroup").glob(f"**/docker-{container_id}.scope"),
    ):
        if (group / "cpu.max").exists():
            quota, period = (group / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        if (group / "cpu.cfs_quota_us").exists():
            quota = int((group / "cpu.cfs_quota_us").read_text())
            return None if quota < 0 else quota / int((group / "cpu.cfs_period_us").read_text())
    return None


def test_grants_moved_between_containers_never_add_up_past_the_node(client, tmp_path, example_models):
    """The control loop lowers one grant before it raises another; each container's update ran in
    a task of its own, and a raise landed before the other's lowering (2.8 cores of quota on a
    node of 2, in 9-27 of 40 swaps)."""
    for name in ("mlp", "cnn_small"):
        shutil.copy(example_models / f"{name}.onnx", tmp_path / f"{name}.onnx")
    model = '[models.{0}]\npath = "{0}.onnx"\nsla_ms = 500\ncpu = {{ cores = 1.0, threads = 1 }}\n'
    models = "".join(model.format(name) for name in ("mlp", "cnn_small"))
    with run_gateway(docker_config(tmp_path / "config.toml", models)) as gateway:
        ids = [c.id for c in owned_by(client, gateway.process.pid)]
        assert len(ids) == 2
        sums: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                sums.append(sum(cores for i in ids if (cores := _quota_cores(i)) is not None))
                time.sleep(0.001)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            for cores in [0.2, 1.8] * 15:  # each pin lowers one model and raises the other at once
                response = requests.put(f"{gateway.base}/admin/models/mlp/cores", json={"cores": cores}, timeout=10)
                assert response.status_code == 200, response.text
                time.sleep(0.02)
        finally:
            done.set()
            sampler.join()
    assert len(sums) > 20 and max(sums) <= 2.0 + 1e-3, (len(sums), max(sums))


def test_a_gpu_executor_container_runs_under_the_cores_reserved_for_it(client, tmp_path, example_models):
    """README: with reserved_cores (ROMA's GC) the GPU executors run under a CPU quota of their own.
    A process executor's group had it; a container had none, and could use every core."""
    shutil.copy(example_models / "mlp.onnx", tmp_path / "mlp.onnx")
    (tmp_path / "gpu.csv").write_text("model,alpha_ms,beta_ms\nmlp,0.1,1.0\n")
    config = docker_config(
        tmp_path / "config.toml",
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 500\ncpu = { cores = 1.5, threads = 1 }\n',
        control='policy = "fixed"\nreserved_cores = 0.5',
    )
    config.write_text(
        config.read_text().replace("[node]\n", "[node]\ngpus = [0]\n", 1)
        + '\n[gpu]\nexecutor = "emulated"\nprofile = "gpu.csv"\n'
    )
    with run_gateway(config) as gateway:
        gpu = next(c for c in owned_by(client, gateway.process.pid) if "-gpu-0-" in c.name)
        assert _quota_cores(gpu.id) == pytest.approx(0.5)
        assert (gpu.attrs["HostConfig"]["CpuQuota"], gpu.attrs["HostConfig"]["CpuPeriod"]) == (5000, 10000)
