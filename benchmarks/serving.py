"""Serving benchmark: the gateway against its peers on the MLP of ../shared/PEERS.md, with wrk.

    .venv/bin/python benchmarks/serving.py [--duration 15] [--skip-pytriton]

In one run, on one machine: the compute floor (onnxruntime in this process, no HTTP), then the
gateway, a naive aiohttp + onnxruntime server and PyTriton, each loaded by the same wrk command
(batch-1 KServe v2 JSON body) at 1, 8 and 64 connections. PyTriton lives in its own virtual
environment under benchmarks/work/ (made on first use); it is never a project dependency.
Results go to benchmarks/work/serving.json and a markdown table to standard output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "work"
MODEL = ROOT / "examples" / "models" / "mlp.onnx"
CONNECTIONS = (1, 8, 64)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def body() -> bytes:
    data = np.random.default_rng(0).standard_normal(512).astype(np.float32).tolist()
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": data}]}).encode()


def median_ms(call: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median wall time of ``call`` in milliseconds, after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return float(np.median(samples)) * 1000


def compute_floor() -> dict[str, float]:
    """Median time of one onnxruntime call in process (one intra-op thread, as the executor)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])
    floor = {}
    for rows in (1, 8, 32):
        x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
        floor[f"batch_{rows}_ms"] = round(median_ms(lambda x=x: session.run(["y"], {"x": x}), 50, 500), 4)
    return floor


def wait_serving(url: str, payload: bytes, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if requests.post(url, data=payload, headers={"Content-Type": "application/json"}, timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def wrk_script(payload: bytes) -> Path:
    """A wrk Lua script that POSTs ``payload`` as JSON (written under benchmarks/work/)."""
    WORK.mkdir(exist_ok=True)
    script = WORK / "post.lua"
    (WORK / "body.json").write_bytes(payload)
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f'local f = io.open("{WORK / "body.json"}", "r")\nwrk.body = f:read("*a")\nf:close()\n'
    )
    return script


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def run_wrk(url: str, connections: int, seconds: int, script: Path) -> dict[str, float]:
    threads = min(2, connections)
    command = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script), url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    result = {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50_ms": _ms(re.search(r"\s50%\s+(\S+)", out).group(1)),
        "p99_ms": _ms(re.search(r"\s99%\s+(\S+)", out).group(1)),
    }
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    result["errors"] = int(non_2xx.group(1)) if non_2xx else 0
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if socket_errors:
        result["errors"] += sum(int(n) for n in socket_errors.groups())
    return result


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pytriton_python() -> Path:
    venv = WORK / "venv-pytriton"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "nvidia-pytriton", "onnxruntime", "onnx", "numpy"], check=True)
    return python


def start_gateway(port: int) -> subprocess.Popen:
    config = WORK / "gateway-mlp.toml"
    config.write_text(
        f'[server]\nmodel_dir = "{MODEL.parent}"\n\n'
        f'[node]\ncpu_cores = 1\n\n[models.mlp]\npath = "{MODEL}"\nsla_ms = 50\nmax_batch_size = 32\n'
        "cpu = { cores = 1.0, threads = 1 }\n"
    )
    gateway = [sys.executable, "-m", "gateway.cli", "serve", str(config), "--port", str(port), "--log-level", "WARNING"]
    return subprocess.Popen(gateway, cwd=ROOT)


def start_naive(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "peers" / "naive_server.py"), str(MODEL), str(port)])


def start_pytriton(port: int) -> subprocess.Popen:
    python = pytriton_python()
    workspace = Path(tempfile.mkdtemp(prefix="pytriton-")) / "ws"
    env = dict(os.environ)
    # Triton's Python backend stub links the system libpython but loads this Python's library.
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [sysconfig.get_config_var("LIBDIR"), env.get("LD_LIBRARY_PATH")]))
    return subprocess.Popen(
        [str(python), str(HERE / "peers" / "pytriton_server.py"), str(MODEL), str(port), str(workspace)], env=env
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=15, help="seconds of wrk per point")
    parser.add_argument("--skip-pytriton", action="store_true")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install -y wrk")
    if not MODEL.exists():
        raise SystemExit("examples/models/mlp.onnx is missing: python examples/make_models.py")
    payload = body()
    script = wrk_script(payload)

    results: dict[str, object] = {"machine": f"{os.cpu_count()} cores, {sys.version.split()[0]}", "duration_s": args.duration}
    results["compute_floor"] = compute_floor()
    print("compute floor:", results["compute_floor"], flush=True)
    servers = {"gateway": start_gateway, "naive aiohttp + onnxruntime": start_naive}
    if not args.skip_pytriton:
        servers["PyTriton"] = start_pytriton
    for name, start in servers.items():
        port = free_port()
        url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
        process = start(port)
        try:
            wait_serving(url, payload, process)
            run_wrk(url, 8, 3, script)  # warm-up
            results[name] = {str(c): run_wrk(url, c, args.duration, script) for c in CONNECTIONS}
            print(name, results[name], flush=True)
        finally:
            stop(process)
            time.sleep(1)

    (WORK / "serving.json").write_text(json.dumps(results, indent=2))
    floor = results["compute_floor"]["batch_1_ms"]
    print("\n| server | conns | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|")
    for name in servers:
        for c in CONNECTIONS:
            r = results[name][str(c)]
            print(f"| {name} | {c} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} |")
    gateway_p50 = results["gateway"]["1"]["p50_ms"]
    overhead = gateway_p50 - floor
    print(f"\ncompute floor batch 1: {floor:.3f} ms; gateway overhead per request, 1 connection: {overhead:.3f} ms (p50 - floor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
