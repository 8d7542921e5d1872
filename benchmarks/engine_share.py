"""How much of the gateway's CPU a request is HTTP, how much JSON, how much the engine.

    .venv/bin/python benchmarks/engine_share.py [--rate 250 | --concurrency 8] [--seconds 15] [--rounds 2]

One gateway process serves every request: its HTTP server, the decoding of the tensors, the
dispatch core and the link to the executors share one event loop, and so one core (on the H200
host, 0.66-0.77 ms of CPU a JSON request: it falls behind near 1,200 requests a second). Several
HTTP front ends, one process each before one engine, would take the HTTP (and, converting JSON
tensors to binary ones, the JSON) off that process. This measures what they would leave in it:
the same load of batch-1 requests for the example MLP (512 floats, on one process executor of 1
core), open-loop Poisson at ``--rate`` or with ``--concurrency`` requests always outstanding
(closed loop: the process kept busy), served three ways, one after the other, ``--rounds`` times:

    http     `gateway serve` over HTTP, loaded by `gateway bench` from another process: the
             gateway process's CPU time (its executors are other processes)
    json     the same Engine in this process, no HTTP: each request's JSON body parsed, served
             and its JSON response encoded as the infer handler does (Handlers._infer)
    binary   the same with the body's tensor as raw bytes (the binary tensor extension) and a
             binary output: what is left once the JSON is a front end's too

Printed: in each way the requests a second, the process's CPU a request and its share of http's,
how busy the process was (cores) and the mean batch the executor ran; and what sleeping and
waking cost a process on the machine (an event loop's 4 ms sleep, a round trip over a socket
pair to a second process with and without 4 ms of sleep between round trips), which a process
that sleeps between requests pays on each. In the json and
binary ways the process also runs the load's own generator (a task a request, as the HTTP server
makes one a request): counted in them, it makes their shares upper bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import psutil
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_serve import request_body  # noqa: E402

from gateway.config import load_config  # noqa: E402
from gateway.engine import Engine  # noqa: E402
from gateway.metrics import GatewayMetrics  # noqa: E402
from gateway.protocol import Limits, encode_infer_response, parse_infer_request  # noqa: E402
from gateway.tools.simulate import gamma_arrivals  # noqa: E402
from tests.helpers import Gateway, metric_value, run_gateway  # noqa: E402

MODEL = "mlp"
SHAPE = [1, 512]


def write_config(folder: Path) -> Path:
    shutil.copy(ROOT / "examples" / "models" / f"{MODEL}.onnx", folder / f"{MODEL}.onnx")
    path = folder / "config.toml"
    path.write_text(
        f"""
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
    """The request body and its Inference-Header-Content-Length, JSON and binary (gpu_serve.py's
    bodies; the binary one asks for a binary output too)."""
    as_json, _ = request_body(SHAPE, binary=False)
    binary, headers = request_body(SHAPE, binary=True, binary_output=True)
    return {"json": (as_json, None), "binary": (binary, headers["Inference-Header-Content-Length"])}


@dataclass
class Served:
    cpu_s: float  # the serving process's CPU time over the load
    answered: int
    batches: float  # batches executed (in-process: the sum of 1 / batch size over the requests)
    seconds: float  # wall time of the load


async def in_process(config_path: Path, way: str, rate: float, seconds: float, concurrency: int) -> Served:
    """The engine alone, driven in this process: open loop at ``rate``, or ``concurrency``
    requests always outstanding (closed loop: the process as busy as it can be)."""
    engine = Engine(load_config(config_path), GatewayMetrics())
    await engine.start()
    # As `gateway serve` does once started (gateway/server.py): a full collection then walks only
    # what serving made, not start-up's objects.
    gc.collect()
    gc.freeze()
    try:
        runtime = engine.models[MODEL]
        assert runtime.signature is not None
        body, header_length = bodies()[way]
        limits = Limits(engine.config.server.max_json_depth, engine.config.server.max_elements)
        answered, batches = 0, 0.0

        async def one() -> None:
            nonlocal answered, batches
            arrival = time.perf_counter()
            parsed = parse_infer_request(body, header_length, runtime.signature, runtime.config.max_batch_size, limits)
            engine.received(runtime)
            result, datatypes = await engine.answer(runtime, parsed, arrival)
            encode_infer_response(runtime.served_name, parsed, result.outputs, datatypes, result.parameters(), runtime.version)
            engine.record(runtime, "success", arrival, result)
            answered += 1
            batches += 1 / result.batch_size

        async def client(until: float) -> None:
            while time.perf_counter() < until:
                await one()

        await asyncio.sleep(1.0)
        cpu_before = time.process_time()
        start, tasks = time.perf_counter(), []
        if concurrency:
            tasks = [asyncio.create_task(client(start + seconds)) for _ in range(concurrency)]
        else:
            for at in gamma_arrivals(rate, None, seconds, random.Random(1)):  # Poisson
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
                tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        return Served(time.process_time() - cpu_before, answered, batches, time.perf_counter() - start)
    finally:
        await engine.stop()


def batches_so_far(gateway: Gateway) -> float:
    """The model's batches executed so far (gateway_batch_size's count on /metrics)."""
    return metric_value(gateway.metrics(), "gateway_batch_size_count", model=MODEL)


def over_http(config_path: Path, rate: float, seconds: float, concurrency: int, folder: Path) -> Served:
    """`gateway serve` loaded by `gateway bench` (open loop at ``rate``, or ``concurrency`` clients)."""
    with run_gateway(config_path) as gateway:
        time.sleep(1.0)
        process = psutil.Process(gateway.process.pid)  # the gateway's own: its executors are others
        batches = batches_so_far(gateway)
        cpu_before = sum(process.cpu_times()[:2])
        output = folder / "bench.json"
        load = ["--concurrency", str(concurrency)] if concurrency else ["--rate", str(rate)]
        subprocess.run(
            [sys.executable, "-m", "gateway.cli", "bench", gateway.base, "--model", MODEL, *load,
             "--duration", str(seconds), "--quiet", "--output", str(output)],
            cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        cpu_s = sum(process.cpu_times()[:2]) - cpu_before
        report = orjson.loads(output.read_bytes())
        # The load's own length (bench's elapsed_s): the wall time around it also holds bench's start.
        return Served(cpu_s, int(report["succeeded"]), batches_so_far(gateway) - batches, float(report["elapsed_s"]))


def _echo(sock: socket.socket, near: socket.socket) -> None:
    """The far end of ``round_trips``: answers each frame with 8 bytes, until b"q"."""
    near.close()  # the fork's copy: the near end is the parent's alone
    while (data := sock.recv(4096)) and data != b"q":
        sock.sendall(data[:8])


async def round_trips(gap_s: float, repeats: int) -> float:
    """This process's CPU (µs) a round trip of a frame the size of a batch-1 MLP request to a
    second process over a socket pair and back, with ``gap_s`` of sleep between round trips."""
    near, far = socket.socketpair()
    echo = multiprocessing.get_context("fork").Process(target=_echo, args=(far, near), daemon=True)
    echo.start()
    far.close()
    reader, writer = await asyncio.open_connection(sock=near)
    frame = [b"x" * 8, b"h" * 120, b"p" * 2048]  # prefix, header, tensor: as executors/wire.py frames it
    cpu_before = time.process_time()
    for _ in range(repeats):
        writer.writelines(frame)
        await writer.drain()
        await reader.readexactly(8)
        if gap_s:
            await asyncio.sleep(gap_s)
    cpu_s = time.process_time() - cpu_before
    writer.write(b"q")
    await writer.drain()
    echo.join(timeout=10)
    if echo.is_alive():
        echo.kill()
    writer.close()
    return cpu_s / repeats * 1e6


async def sleeps(gap_s: float, repeats: int) -> float:
    """This process's CPU (µs) an event loop's sleep of ``gap_s`` costs, nothing else to do."""
    cpu_before = time.process_time()
    for _ in range(repeats):
        await asyncio.sleep(gap_s)
    return (time.process_time() - cpu_before) / repeats * 1e6


def wakeup_costs(repeats: int = 1500) -> str:
    """What sleeping and waking cost a process on this machine, beside a round trip kept busy."""
    gap_s = 0.004
    busy = uvloop.run(round_trips(0.0, repeats))
    idle = uvloop.run(round_trips(gap_s, repeats))
    alone = uvloop.run(sleeps(gap_s, repeats))
    return (
        f"this machine, {repeats} repeats each: a round trip to a second process {busy:.0f} µs of CPU back to back, "
        f"{idle:.0f} µs with {gap_s * 1000:g} ms of sleep between; a {gap_s * 1000:g} ms sleep alone {alone:.0f} µs"
    )


def cpu_ms(served: Served) -> float:
    return served.cpu_s / max(served.answered, 1) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=250.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--concurrency", type=int, default=0, help="closed loop: this many requests outstanding (0: open loop at --rate)"
    )
    args = parser.parse_args()
    rows: dict[str, list[Served]] = {"http": [], "json": [], "binary": []}
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        config_path = write_config(folder)
        for round_ in range(1, args.rounds + 1):
            for way in rows:
                if way == "http":
                    served = over_http(config_path, args.rate, args.seconds, args.concurrency, folder)
                else:
                    served = uvloop.run(in_process(config_path, way, args.rate, args.seconds, args.concurrency))
                rows[way].append(served)
                print(
                    f"round {round_}, {way}: {served.answered} requests ({served.answered / served.seconds:.0f}/s), "
                    f"{cpu_ms(served):.3f} ms of CPU a request, {served.cpu_s / served.seconds:.2f} of a core, "
                    f"batch mean {served.answered / max(served.batches, 1):.2f}",
                    flush=True,
                )
    http = float(np.median([cpu_ms(s) for s in rows["http"]]))
    load = f"{args.concurrency} outstanding" if args.concurrency else f"{args.rate:g} requests/s"
    print(f"\n{wakeup_costs()}")
    print(f"\n{MODEL}, {load} for {args.seconds:g} s, {args.rounds} round(s), medians:\n")
    print("| way | requests/s | CPU a request (ms) | share of http's | busy (cores) | batch mean |")
    print("|---|---|---|---|---|---|")
    for way, served in rows.items():
        ms = float(np.median([cpu_ms(s) for s in served]))
        rps = float(np.median([s.answered / s.seconds for s in served]))
        busy = float(np.median([s.cpu_s / s.seconds for s in served]))
        batch = float(np.median([s.answered / max(s.batches, 1) for s in served]))
        print(f"| {way} | {rps:.0f} | {ms:.3f} | {ms / http:.2f} | {busy:.2f} | {batch:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
