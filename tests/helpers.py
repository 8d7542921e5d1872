"""Test helpers: a real `gateway serve` in a subprocess, and small ONNX models built on the spot."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import psutil
import requests
from aiohttp import web
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Gateway:
    """A `gateway serve` subprocess on a free port; its log is kept for failing tests."""

    def __init__(self, config: Path, port: int, process: subprocess.Popen, log: Path):
        self.config, self.port, self.process, self.log = config, port, process, log
        self.url = f"127.0.0.1:{port}"
        self.base = f"http://{self.url}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def admin(self, model: str | None = None) -> dict:
        path = f"/admin/models/{model}" if model else "/admin/models"
        return requests.get(self.base + path, timeout=10).json()

    def metrics(self) -> str:
        return requests.get(self.base + "/metrics", timeout=10).text

    def executor_pid(self, model: str) -> int:
        return self.admin(model)["executors"][0]["pid"]

    def wait_ready(self, model: str | None = None, timeout: float = 60.0) -> None:
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.output()}")
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(self.base + path, timeout=5).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"gateway not ready after {timeout} s:\n{self.output()}")


# The gateways' logs of this test session, in one folder removed when the session ends (a failing
# test's message carries what it needs of its gateway's output).
LOGS = Path(tempfile.mkdtemp(prefix="gateway-test-logs-"))
atexit.register(shutil.rmtree, LOGS, True)


@contextlib.contextmanager
def run_gateway(
    config: Path,
    extra_env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    args: Sequence[str] = (),
) -> Iterator[Gateway]:
    """`gateway serve` on a free port; ``preexec_fn`` runs in the child first (a resource limit, say);
    ``args`` are more options of `gateway serve` (``--log-format json``, say)."""
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="gateway-", suffix=".log", dir=LOGS)[1])
    env = dict(os.environ, **(extra_env or {}))
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", str(config), "--port", str(port), *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
            preexec_fn=preexec_fn,
        )
    gateway = Gateway(config, port, process, log)
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def write_config(path: Path, models: dict[str, dict], node_cores: float = 2.0) -> Path:
    lines = ["[node]", f"cpu_cores = {node_cores}", ""]
    for name, options in models.items():
        lines.append(f"[models.{name}]")
        for key, value in options.items():
            lines.append(f"{key} = {value!r}" if not isinstance(value, str) else f'{key} = "{value}"')
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def write_gpu_config(folder: Path, gpu_table: str, gpus: tuple[int, ...] = (0,)) -> Path:
    """A config of the MLP (max batch 6) in ``folder`` on real GPUs ``gpus``, with ``gpu_table``'s
    lines in [gpu]."""
    model = "[models.mlp]\npath = 'mlp.onnx'\nsla_ms = 50\nmax_batch_size = 6\n"
    path = folder / "config.toml"
    path.write_text(f"[node]\ncpu_cores = 1.0\ngpus = {list(gpus)}\n[gpu]\n{gpu_table}\n{model}")
    return path


def save_model(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# Every datatype the KServe protocol and ONNX share, with the ONNX element type of each.
DATATYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def identity_model(path: Path) -> Path:
    """One Identity per datatype: in_T[N,3] -> out_T[N,3], so results can be compared exactly."""
    nodes, inputs, outputs = [], [], []
    for name, element in DATATYPES.items():
        low = name.lower()
        nodes.append(helper.make_node("Identity", [f"in_{low}"], [f"out_{low}"]))
        inputs.append(helper.make_tensor_value_info(f"in_{low}", element, ["N", 3]))
        outputs.append(helper.make_tensor_value_info(f"out_{low}", element, ["N", 3]))
    return save_model(helper.make_graph(nodes, "identity", inputs, outputs), path)


def fixed_shape_model(path: Path) -> Path:
    """x[2,4] -> y = x * 2 + 1 with no batch dimension: requests must be served one at a time."""
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["m"]),
        helper.make_node("Add", ["m", "one"], ["y"]),
    ]
    inits = [
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
    ]
    graph = helper.make_graph(
        nodes,
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        inits,
    )
    return save_model(graph, path)


def rowsum_model(path: Path) -> Path:
    """x[N,K] -> s[N,1]: the row sums; K is free, so requests batch only with equal K."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1)],
        "rowsum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "K"])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])],
    )
    return save_model(graph, path)


def table_model(path: Path, rows: int = 10) -> Path:
    """idx[N] -> rows[N,3] of a table of its own of ``rows`` rows: a true batch dimension, and an
    index past the last row an input the model refuses (one request's bad input)."""
    table = helper.make_tensor("table", TensorProto.FLOAT, [rows, 3], [float(v) for v in range(3 * rows)])
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0)],
        "table",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 3])],
        [table],
    )
    return save_model(graph, path)


def two_lengths_model(path: Path) -> Path:
    """table[K,3], idx[N] -> rows = table[idx]: two free leading dimensions that are not one batch."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0)],
        "two_lengths",
        [
            helper.make_tensor_value_info("table", TensorProto.FLOAT, ["K", 3]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, ["N"]),
        ],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["N", 3])],
    )
    return save_model(graph, path)


def random_input(datatype: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([f"s{i}-é".encode() for i in range(int(np.prod(shape)))], dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return rng.random(shape) > 0.5
    from tritonclient.utils import triton_to_np_dtype

    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(dtype)


def busy_model(path: Path, layers: int = 4, width: int = 64) -> Path:
    """The example zoo's upconv model: milliseconds of CPU a request from a 64-float input."""
    sys.path.insert(0, str(EXAMPLES))
    import make_models

    return save_model(make_models.upconv(np.random.default_rng(0), "busy", layers, width), path)


def cpu_ms_per_request(path: Path, shape: Sequence[int] = (1, 1, 8, 8), requests: int = 100, warmup: int = 10) -> float:
    """One request's time on one core of this machine (ONNX Runtime, one thread, the median of
    ``requests`` runs after ``warmup`` runs): tests whose load must leave a set share of a core
    idle derive their rates from it, since the same model's time differs between machines of
    this kind (the busy model: 11.3 ms on the AMD EPYC of 2026-11-25); so do the ROMA
    benchmarks' time scale (benchmarks/roma_cpu.py)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: np.full(tuple(shape), 0.5, dtype=np.float32)}
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for _ in range(requests):
        began = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - began)
    return float(np.median(times)) * 1000


def busy_config(folder: Path, *, sla_ms: float, max_batch_size: int, cores: float, server: str = "", model: str = "") -> Path:
    """busy.onnx served alone at fixed ``cores`` (one thread); ``server`` and ``model`` add config lines."""
    busy_model(folder / "busy.onnx")
    path = folder / "config.toml"
    path.write_text(
        f'[server]\n{server}\n[control]\npolicy = "fixed"\n[models.busy]\npath = "busy.onnx"\nsla_ms = {sla_ms}\n'
        f"max_batch_size = {max_batch_size}\ncpu = {{ cores = {cores}, threads = 1 }}\n{model}\n"
    )
    return path


def metric_value(metrics: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text page (0 when absent), e.g. ``gateway_queue_length``, model="mlp"."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def ended_pid() -> int:
    """The pid of a process that has ended and been reaped (a killed gateway's, say)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert not psutil.pid_exists(process.pid)
    return process.pid


def kill_hard(gateway: Gateway, model: str) -> None:
    """SIGKILL ``gateway`` (no chance to clean up) and wait until its executor of ``model`` has
    ended with it (its connection closed)."""
    executor = psutil.Process(gateway.executor_pid(model))
    gateway.process.kill()
    gateway.process.wait()
    executor.wait(timeout=10)


@contextlib.asynccontextmanager
async def stand_in(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on a free port of 127.0.0.1 for the block: its base URL (a stand-in for a
    gateway, answering only what a test needs)."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """The values ``flag`` is given in a command line, written ``--flag value`` or ``--flag=value``."""
    values = [arg.removeprefix(f"{flag}=") for arg in argv if arg.startswith(f"{flag}=")]
    return values + [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


def period_closed(history_url: str) -> list[dict]:
    """The history as soon as the controller closes its next period (polled every 10 ms)."""
    count = len(requests.get(history_url, timeout=10).json()["history"])
    deadline = time.perf_counter() + 5.0
    while time.perf_counter() < deadline:
        history = requests.get(history_url, timeout=10).json()["history"]
        if len(history) > count:
            return history
        time.sleep(0.01)
    raise AssertionError("the controller closed no period in 5 s")
