"""How much of the gateway's CPU a request is HTTP, how much JSON, how much the engine.

    .venv/bin/python benchmarks/engine_share.py [--rate 250] [--seconds 15] [--rounds 2]

One gateway process serves every request: its HTTP server, the decoding of the tensors, the
dispatch core and the link to the executors share one event loop, and so one core (on the H200
host, 0.66-0.77 ms of CPU a JSON request: it falls behind near 1,200 requests a second). Several
HTTP front ends, one process each before one engine, would take the HTTP (and, converting JSON
tensors to binary ones, the JSON) off that process. This measures what they would leave in it:
the same open-loop Poisson load (batch-1 requests for the example MLP, 512 floats, on one
process executor of 1 core) served three ways, one after the other, ``--rounds`` times:

    http     `gateway serve` over HTTP, loaded by `gateway bench` from another process: the
             gateway process's CPU time (its executors are other processes)
    json     the same Engine in this process, no HTTP: each request's JSON body parsed, served
             and its JSON response encoded as the infer handler does (Handlers._infer)
    binary   the same with the body's tensor as raw bytes (the binary tensor extension) and a
             binary output: what is left once the JSON is a front end's too

Printed: the process's CPU a request in each way, and each as a share of http's. In the json and
binary ways the process also runs the load's own generator (a task a request, as the HTTP server
makes one a request): counted in them, it makes their shares upper bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import psutil
from gateway_ready import wait_ready

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.config import load_config  # noqa: E402
from gateway.engine import Engine  # noqa: E402
from gateway.metrics import GatewayMetrics  # noqa: E402
from gateway.protocol import Limits, encode_infer_response, parse_infer_request  # noqa: E402

MODEL = "mlp"
SHAPE = [1, 512]


def write_config(folder: Path, port: int) -> Path:
    shutil.copy(ROOT / "examples" / "models" / f"{MODEL}.onnx", folder / f"{MODEL}.onnx")
    path = folder / "config.toml"
    path.write_text(
        f"""
[server]
port = {port}
[node]
cpu_cores = 1.0
[control]
policy = "fixed"
[models.{MODEL}]
path = "{MODEL}.onnx"
sla_ms = 50
max_batch_size = 32
cpu = {{ cores = 1.0, threads = 1 }}
"""
    )
    return path


def bodies() -> dict[str, tuple[bytes, str | None]]:
    """The request body and its Inference-Header-Content-Length, JSON and binary."""
    values = np.full(SHAPE, 0.1, dtype=np.float32)
    tensor = {"name": "x", "shape": SHAPE, "datatype": "FP32"}
    as_json = orjson.dumps({"inputs": [{**tensor, "data": values.ravel().tolist()}]})
    header = orjson.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": values.nbytes}}],
            "parameters": {"binary_data_output": True},
        }
    )
    return {"json": (as_json, None), "binary": (header + values.tobytes(), str(len(header)))}


def arrivals(rate: float, seconds: float) -> list[float]:
    rng, times, t = random.Random(1), [], 0.0
    while (t := t + rng.expovariate(rate)) < seconds:
        times.append(t)
    return times


async def in_process(config_path: Path, way: str, rate: float, seconds: float) -> tuple[float, int]:
    """The engine alone, driven in this process: CPU seconds of this process, requests answered."""
    engine = Engine(load_config(config_path), GatewayMetrics())
    await engine.start()
    try:
        runtime = engine.models[MODEL]
        assert runtime.signature is not None
        body, header_length = bodies()[way]
        limits = Limits(engine.config.server.max_json_depth, engine.config.server.max_elements)
        answered = 0

        async def one() -> None:
            nonlocal answered
            arrival = time.perf_counter()
            parsed = parse_infer_request(body, header_length, runtime.signature, runtime.config.max_batch_size, limits)
            engine.received(runtime)
            result, datatypes = await engine.answer(runtime, parsed, arrival)
            encode_infer_response(runtime.served_name, parsed, result.outputs, datatypes, result.parameters(), runtime.version)
            engine.record(runtime, "success", arrival, result)
            answered += 1

        await asyncio.sleep(1.0)
        cpu_before = time.process_time()
        start, tasks = time.perf_counter(), []
        for at in arrivals(rate, seconds):
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        return time.process_time() - cpu_before, answered
    finally:
        await engine.stop()


def over_http(config_path: Path, port: int, rate: float, seconds: float, folder: Path) -> tuple[float, int]:
    """`gateway serve` loaded by `gateway bench`: CPU seconds of the gateway's process, requests sent."""
    log = (folder / "gateway.log").open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", str(config_path)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, server, folder / "gateway.log")
        time.sleep(1.0)
        gateway = psutil.Process(server.pid)
        cpu_before = sum(gateway.cpu_times()[:2])
        output = folder / "bench.json"
        subprocess.run(
            [sys.executable, "-m", "gateway.cli", "bench", base, "--model", MODEL, "--rate", str(rate),
             "--duration", str(seconds), "--quiet", "--output", str(output)],
            cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        cpu_s = sum(gateway.cpu_times()[:2]) - cpu_before
        report = orjson.loads(output.read_bytes())
        return cpu_s, int(report["succeeded"])
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import uvloop

    rows: dict[str, list[float]] = {"http": [], "json": [], "binary": []}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        port = 18000 + random.Random().randrange(2000)
        config_path = write_config(folder, port)
        for round_ in range(1, args.rounds + 1):
            for way in rows:
                if way == "http":
                    cpu_s, answered = over_http(config_path, port, args.rate, args.seconds, folder)
                else:
                    cpu_s, answered = uvloop.run(in_process(config_path, way, args.rate, args.seconds))
                rows[way].append(cpu_s / max(answered, 1) * 1000)
                print(f"round {round_}, {way}: {answered} requests, {rows[way][-1]:.3f} ms of CPU a request", flush=True)
    http = float(np.median(rows["http"]))
    print(f"\n{MODEL}, {args.rate:g} requests/s for {args.seconds:g} s, {args.rounds} round(s), medians:\n")
    print("| way | CPU a request (ms) | share of http's |")
    print("|---|---|---|")
    for way, values in rows.items():
        median = float(np.median(values))
        print(f"| {way} | {median:.3f} | {median / http:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
