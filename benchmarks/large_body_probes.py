"""Health probes answered while 60 MB request bodies are refused or decoded.

    .venv/bin/python benchmarks/large_body_probes.py [--seconds 6] [--runs 3] [--port 8790]

`gateway serve` runs two models on 2 cores: the example MLP with max_batch_size 4096 and an
Identity model of strings. Once it is ready, a child process probes GET /v2/health/live every
20 ms while this one sends, in turn and 100 ms apart until ``--seconds`` have passed:

    strings     60 MB of 15M empty BYTES elements, binary: over max_batch_size, refused (400)
    rows        a 60 MB JSON tensor of 29,296 rows: over max_batch_size, refused (400)
    valid       a 10 MB JSON tensor of 2,048 rows: decoded, served and encoded (200)

Each probe's latency is counted from when it was due, so that a probe held up behind the event
loop counts its whole wait. The bodies are decoded in a worker thread (gateway/server.py's
``_off_loop``), where each step must be short: the loop needs the GIL to answer anything.
Printed per run: the probes' median, p99 and max; and the median of each kind of request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import requests
from gateway_ready import wait_ready
from onnx import TensorProto, helper, save

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MLP = ROOT / "examples" / "models" / "mlp.onnx"

# A child process that probes GET /v2/health/live every 20 ms until a line on its stdin, then
# prints [latencies from when each probe was due, texts of answers other than 200]
# (tests/test_hostile_inputs.py runs it too).
PROBER = """
import json, sys, threading, time
import requests

url = sys.argv[1] + "/v2/health/live"
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), done.set()), daemon=True).start()
latencies, failures = [], []
with requests.Session() as session:
    session.get(url, timeout=30)
    print("started", flush=True)
    start = time.perf_counter()
    k = 0
    while not done.is_set():
        due = start + 0.020 * k
        k += 1
        time.sleep(max(0.0, due - time.perf_counter()))
        response = session.get(url, timeout=30)
        latencies.append(time.perf_counter() - due)
        if response.status_code != 200:
            failures.append(response.text)
print(json.dumps([latencies, failures]))
"""


def strings_model(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])],
        "strings",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["N", 3])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["N", 3])],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)


def bodies() -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """(model, body, headers) of each kind of request."""
    raw = b"\0\0\0\0" * (5_000_000 * 3)
    header = json.dumps(
        {"inputs": [{"name": "text", "shape": [5_000_000, 3], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}]}
    ).encode()
    rows = np.random.default_rng(0).random((2048, 512), dtype=np.float32)
    return {
        "strings": ("strings", header + raw, {"Inference-Header-Content-Length": str(len(header))}),
        "rows": (
            "mlp",
            orjson.dumps({"inputs": [{"name": "x", "shape": [29296, 512], "datatype": "FP32", "data": [0.0] * (29296 * 512)}]}),
            {},
        ),
        "valid": (
            "mlp",
            orjson.dumps(
                {"inputs": [{"name": "x", "shape": [2048, 512], "datatype": "FP32", "data": rows.ravel()}]},
                option=orjson.OPT_SERIALIZE_NUMPY,
            ),
            {},
        ),
    }


def one_run(args: argparse.Namespace, folder: Path, requests_: dict) -> dict:
    base = f"http://127.0.0.1:{args.port}"
    log = folder / "gateway.log"
    with log.open("w") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", str(folder / "config.toml"), "--port", str(args.port)],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(base, server, log)
        prober = subprocess.Popen([sys.executable, "-c", PROBER, base], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert prober.stdout is not None and prober.stdout.readline() == "started\n"
        taken: dict[str, list[float]] = {kind: [] for kind in requests_}
        started = time.monotonic()
        with requests.Session() as session:
            while time.monotonic() - started < args.seconds:
                for kind, (model, body, headers) in requests_.items():
                    began = time.perf_counter()
                    response = session.post(f"{base}/v2/models/{model}/infer", data=body, headers=headers, timeout=120)
                    taken[kind].append(time.perf_counter() - began)
                    expected = 200 if kind == "valid" else 400
                    if response.status_code != expected:
                        raise RuntimeError(f"{kind}: {response.status_code} {response.text[:200]}")
                    time.sleep(0.1)
        report, _ = prober.communicate("stop\n", timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=60)
    latencies, failures = json.loads(report)
    latencies.sort()
    return {
        "probes": len(latencies),
        "failed": len(failures),
        "median_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(0.99 * len(latencies))] * 1e3,
        "max_ms": latencies[-1] * 1e3,
        **{f"{kind}_ms": statistics.median(times) * 1e3 for kind, times in taken.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=8790)
    args = parser.parse_args()
    requests_ = bodies()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "mlp.onnx").write_bytes(MLP.read_bytes())
        strings_model(folder / "strings.onnx")
        (folder / "config.toml").write_text(
            "[node]\ncpu_cores = 2.0\n\n"
            '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 1000\nmax_batch_size = 4096\n\n'
            '[models.strings]\npath = "strings.onnx"\nsla_ms = 1000\nmax_batch_size = 32\n'
        )
        print("run  probes  failed  median_ms  p99_ms  max_ms  strings_ms  rows_ms  valid_ms")
        for run in range(1, args.runs + 1):
            row = one_run(args, folder, requests_)
            print(
                f"{run:>3}  {row['probes']:>6}  {row['failed']:>6}  {row['median_ms']:>9.1f}  {row['p99_ms']:>6.1f}  "
                f"{row['max_ms']:>6.1f}  {row['strings_ms']:>10.0f}  {row['rows_ms']:>7.0f}  {row['valid_ms']:>8.0f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
