"""`gateway bench` against a running gateway: open loop and closed loop, results as JSON."""

from __future__ import annotations

import json
import random
import subprocess
import sys

from gateway.bench import arrival_times, parse_steps
from tests.helpers import ROOT, run_gateway, write_config


def test_poisson_step_schedule():
    times = arrival_times(parse_steps("100:2,0:1,300:1"), random.Random(4))
    first = [t for t in times if t < 2]
    assert 150 < len(first) < 250  # 200 expected
    assert not [t for t in times if 2 <= t < 3]  # a rate of zero sends nothing
    assert 240 < len([t for t in times if t >= 3]) < 360
    assert times == sorted(times)


def test_bench_open_and_closed_loop(tmp_models, tmp_path):
    config = write_config(tmp_models / "config.toml", {"mlp": {"path": "mlp.onnx", "sla_ms": 100, "max_batch_size": 8}})
    with run_gateway(config) as gateway:
        for mode in (["--rate", "50", "--duration", "2"], ["--concurrency", "4", "--duration", "2"], ["--steps", "20:1,60:1"]):
            out = tmp_path / "result.json"
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gateway.cli",
                    "bench",
                    gateway.base,
                    "--model",
                    "mlp",
                    "--quiet",
                    "--output",
                    str(out),
                    *mode,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            assert done.returncode == 0, done.stderr
            result = json.loads(out.read_text())
            assert result["requests"] > 10
            assert result["statuses"] == {"200": result["requests"]}
            assert result["succeeded"] == result["requests"]
            assert result["latency_ms"]["p50"] <= result["latency_ms"]["p99"]
            assert "req/s" in done.stdout
        served = gateway.admin("mlp")["stats"]["requests"]
        assert served >= 30
