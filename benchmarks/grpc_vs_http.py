"""gRPC against HTTP on the MLP, with Triton's own load tool: perf_analyzer -i grpc and -i http at
1, 8 and 64 concurrent clients, one gateway, in one run (the two protocols alternate at each
concurrency, so that drift of the machine hits both alike).

perf_analyzer comes out of the tritonclient 2.51 wheel (tests/perf_analyzer.py). Writes
benchmarks/work/grpc_vs_http.json and prints a Markdown table.

    .venv/bin/python benchmarks/grpc_vs_http.py
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import EXAMPLES, free_port, run_gateway, write_config  # noqa: E402
from tests.perf_analyzer import perf_analyzer  # noqa: E402

WORK = ROOT / "benchmarks" / "work"


def measure(binary: Path, env: dict[str, str], url: str, protocol: str, concurrency: int, window_ms: int) -> dict[str, Any]:
    done = subprocess.run(
        [str(binary), "-m", "mlp", "-u", url, "-i", protocol, "--concurrency-range", str(concurrency)]
        + ["--measurement-interval", str(window_ms), "--stability-percentage", "50", "--max-trials", "20"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"perf_analyzer failed ({protocol}, {concurrency}): {done.stdout[-1500:]} {done.stderr[-1500:]}")
    out = done.stdout

    def number(pattern: str) -> float:
        match = re.search(pattern, out)
        return float(match.group(1)) if match else float("nan")

    return {
        "protocol": protocol,
        "concurrency": concurrency,
        "throughput": number(r"Throughput: ([\d.]+) infer/sec"),
        "p50_us": number(r"p50 latency: (\d+) usec"),
        "p99_us": number(r"p99 latency: (\d+) usec"),
        "server_queue_us": number(r"queue (\d+) usec"),
        "server_infer_us": number(r"compute infer (\d+) usec"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-ms", type=int, default=3000, help="perf_analyzer's measurement window")
    parser.add_argument("--concurrency", default="1,8,64")
    args = parser.parse_args()
    binary, env = perf_analyzer()
    WORK.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="grpc-bench-"))
    (folder / "mlp.onnx").write_bytes((EXAMPLES / "models" / "mlp.onnx").read_bytes())
    config = write_config(folder / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 100, "max_batch_size": 32}})
    grpc_port = free_port()
    rows = []
    with run_gateway(config, args=["--grpc-port", str(grpc_port)]) as gateway:
        urls = {"http": gateway.url, "grpc": f"127.0.0.1:{grpc_port}"}
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            for protocol in ("http", "grpc"):
                rows.append(measure(binary, env, urls[protocol], protocol, concurrency, args.window_ms))
                print(rows[-1], file=sys.stderr)
    (WORK / "grpc_vs_http.json").write_text(json.dumps(rows, indent=2))
    print("| clients | protocol | infer/s | p50 (ms) | p99 (ms) | server queue (ms) | server compute (ms) | gRPC / HTTP |")
    print("|---|---|---|---|---|---|---|---|")
    by = {(r["concurrency"], r["protocol"]): r for r in rows}
    for row in rows:
        http = by[(row["concurrency"], "http")]
        ratio = f"{row['throughput'] / http['throughput']:.2f}x" if row["protocol"] == "grpc" else ""
        print(
            f"| {row['concurrency']} | {row['protocol']} | {row['throughput']:.0f} | {row['p50_us'] / 1000:.2f} "
            f"| {row['p99_us'] / 1000:.2f} | {row['server_queue_us'] / 1000:.3f} "
            f"| {row['server_infer_us'] / 1000:.3f} | {ratio} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
