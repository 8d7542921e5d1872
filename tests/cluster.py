"""A cluster on this machine for tests and benchmarks: `gateway worker`s on hosts of their own
(network namespaces, tests/netns.py) and `gateway serve` dispatchers in the root namespace."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests

from tests.helpers import EXAMPLES, ROOT, Gateway, run_gateway
from tests.netns import Hosts, LoopbackHosts

WORKER_PORT = 7070
WORKER_HTTP_PORT = 8081
TOKEN = secrets.token_hex(16)
ENV = {"GATEWAY_WORKER_TOKEN": TOKEN}

# The example models (examples/config.toml), small cores so that three workers fit on two.
EXAMPLE_MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"path": "models/mlp.onnx", "sla_ms": 50, "max_batch_size": 32},
    "cnn_small": {"path": "models/cnn_small.onnx", "sla_ms": 100, "max_batch_size": 16},
    "cnn_large": {"path": "models/cnn_large.onnx", "sla_ms": 300, "max_batch_size": 8},
    "ppocr_det": {"path": "models/ppocr_det.onnx", "sla_ms": 2000, "max_batch_size": 4},
}


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return repr(value)


def cluster_config(
    path: Path,
    workers: str | list[str] | None,
    models: dict[str, dict[str, Any]],
    *,
    cpu_cores: float = 0.6,
    policy: str = "fixed",
    cluster: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    node: dict[str, Any] | None = None,
    gpu: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
) -> Path:
    """One config for the workers and the dispatchers, as a Kubernetes ConfigMap would hold it
    (``workers`` None: a gateway serving alone, for comparison)."""
    cores = round(cpu_cores / max(1, sum(m.get("cpu_executor", True) for m in models.values())), 3)
    tables: dict[str, dict[str, Any]] = {
        "server": {"model_dir": str(EXAMPLES), **(server or {})},
        "node": {"cpu_cores": cpu_cores, **(node or {})},
        "control": {"policy": policy},
    }
    if gpu is not None:
        tables["gpu"] = gpu
    if worker is not None:
        tables["worker"] = worker
    if workers is not None:
        tables["cluster"] = {"workers": workers, "heartbeat_timeout_s": 2.0, "start_timeout_s": 90.0, **(cluster or {})}
    lines = []
    for table, values in tables.items():
        lines.append(f"[{table}]")
        lines += [f"{key} = {_toml(value)}" for key, value in values.items()]
    for name, options in models.items():
        cpu = {"cpu": {"cores": cores, "threads": 1}} if options.get("cpu_executor", True) else {}
        options = {**cpu, **options, "path": str(EXAMPLES / options["path"])}
        lines.append(f"[models.{name}]")
        lines += [f"{key} = {_toml(value)}" for key, value in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class Worker:
    """A `gateway worker` on host ``i``; ``start`` again after a kill."""

    def __init__(self, hosts: Hosts | LoopbackHosts, i: int, config: Path):
        self.hosts, self.i, self.config = hosts, i, config
        self.address = hosts.address(i)
        self.endpoint = f"{self.address}:{WORKER_PORT}"
        self.log = Path(tempfile.mkstemp(prefix=f"worker{i}-", suffix=".log")[1])
        self.process: subprocess.Popen[Any] | None = None

    def start(self) -> Worker:
        argv = [sys.executable, "-m", "gateway.cli", "worker", str(self.config), "--listen", self.endpoint]
        argv += ["--http-port", str(WORKER_HTTP_PORT), "--name", f"worker{self.i}"]
        with self.log.open("ab") as sink:
            self.process = self.hosts.popen(
                self.i, argv, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, **ENV)
            )
        return self

    def url(self, path: str) -> str:
        return f"http://{self.address}:{WORKER_HTTP_PORT}{path}"

    def state(self) -> dict[str, Any]:
        return requests.get(self.url("/v2/worker"), timeout=5).json()

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"worker {self.i} exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url("/v2/health/ready"), timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"worker {self.i} not ready after {timeout} s:\n{self.output()}")

    def kill(self) -> None:
        """kill -9: no goodbye to the dispatchers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


@contextlib.contextmanager
def workers_on(hosts: Hosts | LoopbackHosts, count: int, config: Path) -> Iterator[list[Worker]]:
    workers = [Worker(hosts, i, config).start() for i in range(count)]
    try:
        for worker in workers:
            worker.wait_ready()
        yield workers
    finally:
        for worker in workers:
            worker.stop()


@contextlib.contextmanager
def dispatcher(config: Path) -> Iterator[Gateway]:
    with run_gateway(config, extra_env=ENV) as gateway:
        yield gateway


def cluster_state(gateway: Gateway) -> dict[str, Any]:
    return requests.get(gateway.base + "/admin/cluster", timeout=5).json()


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not within {timeout} s")


async def wait_for_async(predicate: Any, timeout: float, what: str) -> None:
    """``wait_for`` inside a test's event loop, which goes on running (a client's tasks on it too)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{what} not within {timeout} s")
