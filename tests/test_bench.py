"""`gateway bench` against a running gateway: open loop and closed loop, results as JSON."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time

import aiohttp
from aiohttp import web

from gateway.tools.arguments import rate_steps
from gateway.tools.bench import arrival_times, open_loop
from tests.helpers import ROOT, run_gateway, write_config


def test_poisson_step_schedule():
    times = arrival_times(rate_steps("100:2,0:1,300:1"), random.Random(4))
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
            assert result["sla_ms"] == 100
            assert "req/s" in done.stdout
            # The report beside the JSON: a PNG of two charts, as wide as drawn (1000 x 700 pixels).
            report = out.with_suffix(".png")
            header = report.read_bytes()[:24]
            assert header[:8] == b"\x89PNG\r\n\x1a\n"
            assert (int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")) == (1000, 700)
            report.unlink()
        served = gateway.admin("mlp")["stats"]["requests"]
        assert served >= 30


class SlowBar:
    """A progress bar on a slow terminal: each update holds the generator's loop for 50 ms."""

    def update(self, n: int) -> None:
        time.sleep(0.05)


async def test_open_loop_times_requests_from_when_they_were_due():
    """Coordinated omission: when the generator falls behind its schedule, the lag is latency too.

    Six requests are due within 5 ms, but the generator cannot send any before its progress bar
    has held it 6 x 50 ms: each client waited at least 295 ms, though the server answers at once.
    """

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/infer", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/infer"
    times = [0.0, 0.001, 0.002, 0.003, 0.004, 0.005]
    try:
        async with aiohttp.ClientSession() as session:
            behind = await open_loop(session, url, b"{}", times, SlowBar())  # type: ignore[arg-type]
            on_time = await open_loop(session, url, b"{}", times, None)
    finally:
        await runner.cleanup()
    assert behind.statuses == on_time.statuses == {"200": 6}
    assert min(behind.latencies_ms) >= 6 * 50 - 5
    assert max(on_time.latencies_ms) < 200  # on schedule, only the answer's own time
