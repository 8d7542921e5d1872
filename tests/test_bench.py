"""`gateway bench` against a running gateway: open loop and closed loop, results as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import requests
from aiohttp import web

from gateway.tools import bench
from gateway.tools.arguments import rate_steps
from gateway.tools.bench import arrival_times, open_loop
from tests.cluster import wait_for
from tests.helpers import ROOT, free_port, run_gateway, stand_in, write_config

# A stand-in for a gateway: the model's metadata and config (its SLA), and infer answered at once.
STAND_IN = """
import sys
from aiohttp import web

async def metadata(request):
    return web.json_response({"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []})

async def config(request):
    return web.json_response({"parameters": {"sla_ms": {"string_value": "50"}}})

served = 0

async def infer(request):
    global served
    await request.read()
    served += 1
    return web.json_response({"outputs": []})

async def count(request):
    return web.json_response({"served": served})

app = web.Application()
app.router.add_get("/count", count)
app.router.add_get("/v2/models/m", metadata)
app.router.add_get("/v2/models/m/config", config)
app.router.add_post("/v2/models/m/infer", infer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


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
    times = [0.0, 0.001, 0.002, 0.003, 0.004, 0.005]
    async with stand_in(app) as base, aiohttp.ClientSession() as session:
        behind = await open_loop(session, f"{base}/infer", b"{}", times, SlowBar())  # type: ignore[arg-type]
        on_time = await open_loop(session, f"{base}/infer", b"{}", times, None)
    assert behind.statuses == on_time.statuses == {"200": 6}
    assert min(behind.latencies_ms) >= 6 * 50 - 5
    assert max(on_time.latencies_ms) < 200  # on schedule, only the answer's own time


def _start_stand_in(folder: Path) -> tuple[subprocess.Popen, int]:
    """STAND_IN in a process of its own, answering: the process and its port."""
    (folder / "stand_in.py").write_text(STAND_IN)
    port = free_port()
    server = subprocess.Popen([sys.executable, str(folder / "stand_in.py"), str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{port}/v2/models/m", timeout=1)
            break
        except requests.ConnectionError:
            time.sleep(0.1)
    return server, port


def test_bench_keeps_its_results_when_the_gateway_dies(tmp_path):
    """The gateway killed mid-run: what was answered and what was not are counted, the model's SLA
    (read after the run) is unknown, and the summary and --output are there all the same."""
    server, port = _start_stand_in(tmp_path)
    try:
        out = tmp_path / "result.json"
        command = [sys.executable, "-m", "gateway.cli", "bench", f"http://127.0.0.1:{port}", "--model", "m"]
        load = ["--rate", "50", "--duration", "6", "--quiet", "--output", str(out)]
        running = subprocess.Popen([*command, *load], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Killed mid-run, once some requests were answered (the bench's own start takes a
        # second or more on a slow machine: a fixed time could kill it before its first).
        count = f"http://127.0.0.1:{port}/count"
        wait_for(lambda: requests.get(count, timeout=5).json()["served"] >= 20, 30, "20 requests served")
        server.kill()
        server.wait()
        stdout, stderr = running.communicate(timeout=60)
    finally:
        server.kill()
        server.wait()
    assert running.returncode == 0, stderr
    result = json.loads(out.read_text())
    assert 0 < result["succeeded"] < result["requests"]
    # After the kill, refused connections; at the kill, perhaps one cut (ServerDisconnectedError).
    assert result["errors"] == result["requests"] - result["succeeded"] > 0 and "ClientConnectorError" in result["statuses"]
    assert result["sla_ms"] is None
    assert f"{result['succeeded']}/{result['requests']} ok" in stdout and f"{result['errors']} without an answer" in stdout
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_report_that_cannot_be_saved_loses_none_of_the_results(tmp_path, monkeypatch, capsys):
    """The JSON was written after the PNG: a report that failed to save (a folder of its name)
    lost the results of the whole run to a traceback."""
    from gateway.tools import bench_report

    def unsaved(path, *_):
        raise IsADirectoryError(21, "Is a directory", str(path))

    monkeypatch.setattr(bench_report, "write_report", unsaved)
    server, port = _start_stand_in(tmp_path)
    try:
        parser = argparse.ArgumentParser()
        bench.add_arguments(parser)
        out = tmp_path / "result.json"
        args = parser.parse_args([f"http://127.0.0.1:{port}", "--model", "m", "--rate", "20", "--duration", "0.5"])
        args.quiet, args.output = True, str(out)
        assert bench.run(args) == 1
    finally:
        server.kill()
        server.wait()
    result = json.loads(out.read_text())
    assert result["requests"] > 0 and result["succeeded"] == result["requests"]
    said = capsys.readouterr()
    assert f"{result['succeeded']}/{result['requests']} ok" in said.out
    assert said.err.startswith(f"gateway bench: the report {out.with_suffix('.png')} was not written: ")


@pytest.mark.parametrize("load", [["--rate", "20", "--duration", "0.5"], ["--concurrency", "2", "--duration", "0.5"]])
async def test_a_request_past_the_client_timeout_is_counted_an_error(load, monkeypatch):
    """A server that never answers infer: each request ends at bench's own timeout, counted as a
    TimeoutError (it was lost from the counts, and the closed loop ended in a traceback)."""
    released = asyncio.Event()

    async def metadata(request: web.Request) -> web.Response:
        return web.json_response({"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]})

    async def config(request: web.Request) -> web.Response:
        return web.json_response({"parameters": {"sla_ms": {"string_value": "50"}}})

    async def never(request: web.Request) -> web.Response:
        await request.read()
        await released.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/v2/models/m", metadata)
    app.router.add_get("/v2/models/m/config", config)
    app.router.add_post("/v2/models/m/infer", never)
    monkeypatch.setattr(bench, "CLIENT_TIMEOUT_S", 0.3)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    async with stand_in(app) as base:
        args = parser.parse_args([base, "--model", "m", "--quiet", *load])
        try:
            result, report = await bench._run(args)
        finally:
            released.set()
    assert report is None  # no --output
    assert result["requests"] > 0 and result["succeeded"] == 0
    assert result["statuses"] == {"TimeoutError": result["requests"]} and result["errors"] == result["requests"]
    assert result["sla_ms"] == 50  # the server answers all but infer
