"""A short `gateway serve` run on a real GPU (ONNX Runtime's CUDA provider) beside CPU executors.

    python benchmarks/gpu_serve.py [--rate 400] [--seconds 10] [--no-warmup] [--cudnn-conv-algo-search exhaustive]
                                   [--batch-shapes fixed] [--binary] [--against-stub] [--gc-log | --request-log]

Two models of the example zoo (mlp, cnn_small), one CPU executor each (1 core) and one GPU
executor holding both, the default GPU policy, Poisson arrivals split evenly, batch-1 JSON.
Prints, per model: answers by status, where they ran, p50/p99 response time, and the l(b) the
gateway measured on the GPU and on the CPU (GET /admin/models/NAME, "profiles"), and how long
the gateway took to be ready and what the GPU executor's warm-up took ([gpu] warmup, on unless
``--no-warmup``). ``--batch-shapes`` and ``--cudnn-conv-algo-search`` set [gpu]'s keys of those
names. Beside the client's response times it prints the gateway's own count of requests over
their SLA (gateway_sla_violations on /metrics, timed from when the gateway read the request) and
the GPU memory each process holds (nvidia-smi), and per half second of the run the requests over
their SLA and the slowest response, which tells stalls (late requests in bursts) from a lack of
capacity (late requests throughout); beside it, to tell the gateway's stalls from the machine's
and the client's, the machine's own during the load (benchmarks/stall_probe.py: an idle
process's wake-ups over 5 ms late, and the most steal time of a second) and the client's (its
event loop's sleeps over 5 ms late, its collections of over 5 ms). ``--gc-log`` runs the gateway
in benchmarks/gc_pauses.py's child and prints its garbage collections of over 5 ms during the
load. ``--request-log`` runs the gateway with its request log (``--log-format json``) and prints,
per half second of the gateway's own clock, its requests over their SLA and the longest of their
times in the queue, on the executor and in the gateway as a whole: a late burst that the gateway
timed short was late before the gateway read it (the HTTP layer, the client), one it timed long
waited in its queue or ran long on its executor. Needs an NVIDIA GPU and onnxruntime-gpu; it says
so and exits 2 without them.

``--against-stub`` runs the same client against a stub that answers every request at once,
instead of the gateway: the client's own share of the response times, on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import psutil
import uvloop
from aiohttp import web
from gateway_ready import wait_ready
from prometheus_client.parser import text_string_to_metric_families
from stall_probe import in_window, probing

from gateway.tools.simulate import zoo_arrivals

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"mlp": [1, 512], "cnn_small": [1, 3, 32, 32]}
SLA_MS = {"mlp": 50.0, "cnn_small": 100.0}
TIMELINE_STEP_S = 0.5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request_body(shape: list[int], binary: bool, binary_output: bool = False) -> tuple[bytes, dict[str, str]]:
    """A batch-1 infer request of 0.1s: the tensor as a JSON list, or as raw bytes after the JSON
    header (the binary tensor extension, as tritonclient sends with binary_data=True), asking for
    the outputs as raw bytes too with ``binary_output``."""
    values = np.full(shape, 0.1, dtype=np.float32)
    tensor: dict = {"name": "x", "shape": shape, "datatype": "FP32"}
    if not binary:
        return orjson.dumps({"inputs": [{**tensor, "data": values.ravel().tolist()}]}), {}
    request: dict = {"inputs": [{**tensor, "parameters": {"binary_data_size": values.nbytes}}]}
    if binary_output:
        request["parameters"] = {"binary_data_output": True}
    header = orjson.dumps(request)
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return header + values.tobytes(), headers


Row = tuple[int, str, float, float]  # status, where it ran, response ms, when it was due (s into the run)


async def loop_lag(stalls: list[tuple[float, float]], report_ms: float = 5.0) -> None:
    """Until cancelled, write down (perf_counter time, ms late) of each 1 ms sleep of this event
    loop that woke over ``report_ms`` late: the client's own stalls, when its requests went out late."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(0.001)
        if (late_ms := (time.perf_counter() - before - 0.001) * 1000) > report_ms:
            stalls.append((time.perf_counter(), late_ms))


async def drive(
    base: str, rate: float, seconds: float, binary: bool = False, lags: list[tuple[float, float]] | None = None
) -> dict[str, list[Row]]:
    """Send the load and collect each answer; ``lags`` gets the client loop's stalls (``loop_lag``)."""
    bodies = {name: request_body(shape, binary) for name, shape in MODELS.items()}
    watcher = asyncio.create_task(loop_lag(lags if lags is not None else []))
    # Poisson arrivals, the load split evenly between the models (the simulator's own draws).
    arrivals = zoo_arrivals({name: rate / len(MODELS) for name in MODELS}, None, seconds, random.Random(1))
    results: dict[str, list[Row]] = {name: [] for name in MODELS}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:

        async def one(model: str, at: float) -> None:
            due = start + at
            body, headers = bodies[model]
            async with session.post(f"{base}/v2/models/{model}/infer", data=body, headers=headers) as response:
                answer = orjson.loads(await response.read())
                where = answer.get("parameters", {}).get("executed_on", "-") if response.status == 200 else "-"
                # Timed from when it was due (no coordinated omission): the client's own lag counts.
                results[model].append((response.status, where, (time.perf_counter() - due) * 1000, at))

        # One generator sends each request when it is due. (Creating every request's task up front
        # took longer than the lead it had at 1,500 requests/s: the first ones started late.)
        start, tasks = time.perf_counter() + 0.1, []
        for at, model in arrivals:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(model, at)))
        await asyncio.gather(*tasks)
    watcher.cancel()
    return results


def run_client(base: str, rate: float, seconds: float, binary: bool, load_began: float) -> tuple[dict[str, list[Row]], str]:
    """``drive`` on a fresh event loop; and a line of the client's own stalls during it (its
    collections of over 5 ms and its event loop's sleeps over 5 ms late, in seconds from
    ``load_began``, on the clock of time.monotonic and perf_counter alike), to tell them from
    the gateway's."""
    collections: list[tuple[float, int, float]] = []
    lags: list[tuple[float, float]] = []
    began = [0.0]

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        elif (ms := (time.perf_counter() - began[0]) * 1000) > 5:
            collections.append((round(time.perf_counter() - load_began, 2), info["generation"], round(ms, 1)))

    gc.callbacks.append(record)
    try:
        results = uvloop.run(drive(base, rate, seconds, binary, lags))
    finally:
        gc.callbacks.remove(record)
    stalls = [(round(t - load_began, 2), round(ms, 1)) for t, ms in lags]
    return results, (
        f"client during the load: event-loop stalls over 5 ms (s, ms) {stalls}, "
        f"collections over 5 ms (s, generation, ms) {collections}"
    )


def serve_stub(port: int) -> None:
    """Answer every infer request at once with a batch-1 output, as a gateway with no work would."""
    answer = orjson.dumps({"outputs": [{"name": "y", "shape": [1, 10], "datatype": "FP32", "data": [0.0] * 10}]})

    async def infer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    async def ready(_: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v2/models/{name}/infer", infer)
    app.router.add_get("/v2/health/ready", ready)
    web.run_app(app, host="127.0.0.1", port=port, print=None, loop=uvloop.new_event_loop())


def summary(rows: list[Row], sla_ms: float) -> tuple[str, int]:
    """The client's view of a model's requests: answers by status, p50 / p99 of those answered, and
    how many of them came after ``sla_ms``."""
    statuses = dict(Counter(status for status, _, _, _ in rows))
    answered = np.asarray([ms for status, _, ms, _ in rows if status == 200])
    late = int((answered > sla_ms).sum())
    if not answered.size:
        answered = np.zeros(1)
    p50, p99 = np.percentile(answered, [50, 99])
    return f"{len(rows)} requests, statuses {statuses}, p50 {p50:.2f} ms, p99 {p99:.2f} ms", late


def gateway_late_counts(metrics_text: str) -> dict[str, int]:
    """Per model, the requests the gateway itself answered after their SLA (gateway_sla_violations)."""
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "gateway_sla_violations":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["model"]] = round(sample.value)
    return counts


def gpu_memory() -> str:
    """The GPU memory each process holds, as nvidia-smi reports it."""
    query = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"nvidia-smi failed: {error}"


def timeline(results: dict[str, list[Row]], sla_ms: dict[str, float], step_s: float = TIMELINE_STEP_S) -> str:
    """Per ``step_s`` of the run (by when each request was due): the requests over their SLA and
    the slowest response (ms). Late requests bunched in a few steps are stalls; spread over all
    of them, a lack of capacity."""
    late: Counter[int] = Counter()
    slowest: dict[int, float] = {}
    for name, rows in results.items():
        for _, _, ms, at in rows:
            step = int(at / step_s)
            late[step] += ms > sla_ms[name]
            slowest[step] = max(slowest.get(step, 0.0), ms)
    return " ".join(f"{i * step_s:g}s:{late[i]}/{slowest[i]:.0f}" for i in sorted(slowest))


def gateway_timeline(log_text: str, began_wall: float, sla_ms: dict[str, float], step_s: float = TIMELINE_STEP_S) -> str:
    """Per ``step_s`` of the gateway's request log (by when each request ended), the requests, those
    the gateway timed over their SLA, and the longest queue, executor and total times among them."""
    steps: dict[int, list[float]] = {}
    for line in log_text.splitlines():
        if '"infer request"' not in line:
            continue
        record = orjson.loads(line)
        total, queue, compute = record.get("total_ms"), record.get("queue_ms"), record.get("compute_ms")
        if total is None:
            continue
        ended = datetime.datetime.fromisoformat(record["time"]).timestamp() - began_wall
        step = steps.setdefault(int(ended // step_s), [0, 0, 0.0, 0.0, 0.0])
        step[0] += 1
        step[1] += total > sla_ms[record["model"]]
        step[2], step[3], step[4] = max(step[2], queue or 0.0), max(step[3], compute or 0.0), max(step[4], total)
    return " ".join(f"{i * step_s:g}s:{n}/{late}/{q:.0f}/{c:.0f}/{t:.0f}" for i, (n, late, q, c, t) in sorted(steps.items()))


def print_results(results: dict[str, list[Row]], sla_ms: dict[str, float]) -> None:
    for name, rows in results.items():
        text, late = summary(rows, sla_ms[name])
        print(f"{name}: {text}, over {sla_ms[name]:g} ms (client) {late}")
    print(f"over SLA / slowest ms, per {TIMELINE_STEP_S:g} s: {timeline(results, sla_ms)}")


def against_stub(rate: float, seconds: float, binary: bool) -> int:
    port = free_port()
    stub = subprocess.Popen([sys.executable, __file__, "--serve-stub", str(port)])
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, stub)
        results, client = run_client(base, rate, seconds, binary, time.monotonic() + 0.1)
        tensors = "binary" if binary else "JSON"
        print(f"rate {rate:g} req/s for {seconds:g} s, {tensors} tensors, against a stub answering at once (the client's share)")
        print_results(results, SLA_MS)
        print(client)
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-warmup", action="store_true", help="[gpu] warmup = false")
    parser.add_argument("--cudnn-conv-algo-search", choices=["exhaustive", "heuristic", "default"], default="exhaustive")
    parser.add_argument("--batch-shapes", choices=["fixed", "exact"], default="fixed")
    parser.add_argument("--binary", action="store_true", help="send tensors as raw bytes (binary tensor extension)")
    parser.add_argument("--against-stub", action="store_true", help="the client alone, against a stub")
    # The gateway runs in gc_pauses.py's child with --gc-log, which serves with the text log.
    logs = parser.add_mutually_exclusive_group()
    logs.add_argument("--gc-log", action="store_true", help="print the gateway's garbage collections of over 5 ms")
    logs.add_argument("--request-log", action="store_true", help="print the gateway's own times of its late requests")
    parser.add_argument("--serve-stub", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_stub:
        serve_stub(args.serve_stub)
        return 0
    if args.against_stub:
        return against_stub(args.rate, args.seconds, args.binary)
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"no CUDA provider in onnxruntime {ort.__version__}: nothing to measure", file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="gpu-serve-"))
    for name in MODELS:
        shutil.copy(ROOT / "examples" / "models" / f"{name}.onnx", folder / f"{name}.onnx")
    port = free_port()
    (folder / "config.toml").write_text(
        f"""
[server]
port = {port}
[node]
cpu_cores = 2.0
gpus = [0]
[gpu]
executor = "cuda"
warmup = {"false" if args.no_warmup else "true"}
cudnn_conv_algo_search = "{args.cudnn_conv_algo_search}"
batch_shapes = "{args.batch_shapes}"
[control]
policy = "fixed"
[models.mlp]
path = "mlp.onnx"
sla_ms = {SLA_MS["mlp"]:g}
max_batch_size = 32
cpu = {{ cores = 1.0, threads = 1 }}
[models.cnn_small]
path = "cnn_small.onnx"
sla_ms = {SLA_MS["cnn_small"]:g}
max_batch_size = 32
cpu = {{ cores = 1.0, threads = 1 }}
"""
    )
    log = (folder / "gateway.log").open("wb")
    config, gc_report = str(folder / "config.toml"), folder / "gc.json"
    # With --gc-log the gateway runs in benchmarks/gc_pauses.py's child, which records each collection.
    serve = (
        [str(ROOT / "benchmarks" / "gc_pauses.py"), "--child", config, str(gc_report)]
        if args.gc_log
        else ["-m", "gateway.cli", "serve", config, *(["--log-format", "json"] if args.request_log else [])]
    )
    process = subprocess.Popen(
        [sys.executable, *serve],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        import requests

        try:
            ready_s = wait_ready(base, process, folder / "gateway.log")
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        executors = requests.get(f"{base}/admin/models/{next(iter(MODELS))}", timeout=10).json()["executors"]
        gpu_providers = {e["provider"] for e in executors if e["id"].startswith("gpu")}
        if gpu_providers != {"CUDAExecutionProvider"}:
            print(f"the GPU executor runs {gpu_providers}, not the CUDA provider: nothing to measure", file=sys.stderr)
            return 2
        gateway = psutil.Process(process.pid)  # the gateway's own process: its executors are others
        cpu_before = sum(gateway.cpu_times()[:2])
        load_began = time.monotonic() + 0.1  # drive's first request is due 0.1 s in
        load_began_wall = time.time() + (load_began - time.monotonic())  # the request log's clock
        with probing() as stalls:
            results, client = run_client(base, args.rate, args.seconds, args.binary, load_began)
        gateway_cpu_s = sum(gateway.cpu_times()[:2]) - cpu_before
        warmup = "off" if args.no_warmup else "on"
        print(
            f"rate {args.rate:g} req/s for {args.seconds:g} s, default GPU policy, CUDA provider, "
            f"{'binary' if args.binary else 'JSON'} tensors, batch shapes {args.batch_shapes}, "
            f"cuDNN search {args.cudnn_conv_algo_search}, warm-up {warmup}; "
            f"ready after {ready_s:.1f} s"
        )
        for line in (folder / "gateway.log").read_text().splitlines():
            if "GPU executor" in line or "profile l(b)" in line:
                print("  log:", line.split("] ", 1)[-1] if "] " in line else line)
        gateway_late = gateway_late_counts(requests.get(f"{base}/metrics", timeout=10).text)
        for name, rows in results.items():
            admin = requests.get(f"{base}/admin/models/{name}", timeout=10).json()
            text, late = summary(rows, SLA_MS[name])
            places = dict(Counter(where for _, where, _, _ in rows))
            profiles = {d: f"l(b) = {p['per_item_ms']:.3f} b + {p['fixed_ms']:.3f} ms" for d, p in admin["profiles"].items()}
            print(
                f"{name}: SLA {admin['sla_ms']:g} ms, {text}, ran on {places}, "
                f"over SLA: client {late}, gateway {gateway_late.get(name, 0)}, "
                f"executors {[(e['id'], e['provider']) for e in admin['executors']]}, profiles {profiles}"
            )
        print(f"over SLA / slowest ms, per {TIMELINE_STEP_S:g} s: {timeline(results, SLA_MS)}")
        # perf_counter and monotonic are one clock on Linux (CLOCK_MONOTONIC), in every process.
        machine = stalls.since(load_began)
        late_wakeups = [(round(t, 2), round(ms, 1)) for t, ms in machine["late"] if 0 <= t <= args.seconds]
        _, most_steal = in_window(machine, 0.0, args.seconds)
        print(
            f"machine during the load: wake-ups over 5 ms late (s into it, ms) {late_wakeups}, "
            f"most steal time in a second {most_steal:.0f} ms"
        )
        print(client)
        if args.request_log:
            print(f"gateway's own times per {TIMELINE_STEP_S:g} s (requests, over SLA, longest queue / executor / total ms):")
            print(" ", gateway_timeline((folder / "gateway.log").read_text(), load_began_wall, SLA_MS))
        warnings = [line for line in (folder / "gateway.log").read_text().splitlines() if "WARNING" in line or "ERROR" in line]
        print(f"gateway log: {len(warnings)} warning or error lines", *warnings[:8], sep="\n  ")
        answered = sum(len(rows) for rows in results.values())
        print(
            f"gateway process CPU: {gateway_cpu_s:.2f} s while sending, "
            f"{gateway_cpu_s / max(answered, 1) * 1000:.3f} ms a request"
        )
        print("GPU memory:", gpu_memory())
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    if args.gc_log and gc_report.exists():
        collections = json.loads(gc_report.read_text())["collections"]
        long = [(round(at - load_began, 2), gen, round(ms, 1)) for at, gen, ms in collections if ms > 5 and at >= load_began]
        print(f"gateway collections over 5 ms during the load (s into it, generation, ms): {long}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
