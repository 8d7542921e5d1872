"""Pinning a model's cores through the admin API, and the `gateway identify` step test built on it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import aiohttp
import requests
from aiohttp import web

from gateway.tools.identify import _step
from tests.helpers import ROOT, busy_model, run_gateway, stand_in


def _config(tmp_path, policy: str = "pi") -> None:
    busy_model(tmp_path / "busy.onnx", layers=3, width=48)
    (tmp_path / "config.toml").write_text(
        f"""
[node]
cpu_cores = 1.5
[control]
policy = "{policy}"
[models.busy]
path = "busy.onnx"
sla_ms = 100
cpu = {{ cores = 0.3, min_cores = 0.1, max_cores = 1.5, threads = 1 }}
"""
    )


def test_pin_and_release_cores(tmp_path):
    _config(tmp_path)
    with run_gateway(tmp_path / "config.toml") as gateway:
        url = f"{gateway.base}/admin/models/busy/cores"
        for bad in ({"cores": -1}, {"cores": "many"}, {"cores": True}, {}, [2]):
            response = requests.put(url, json=bad, timeout=10)
            assert response.status_code == 400, bad
            assert "cores" in response.json()["error"]
        assert requests.put(f"{gateway.base}/admin/models/nope/cores", json={"cores": 1}, timeout=10).status_code == 404
        # More than the node has means nothing: refused, naming the bound.
        too_many = requests.put(url, json={"cores": 4.0}, timeout=10)
        assert too_many.status_code == 400 and "cpu_cores" in too_many.json()["error"]
        pinned = requests.put(url, json={"cores": 1.5}, timeout=10).json()
        assert pinned["pinned_cores"] == 1.5 and pinned["executors"][0]["cores"] == 1.5
        released = requests.put(url, json={"cores": None}, timeout=10).json()
        assert released["pinned_cores"] is None
        node = requests.get(f"{gateway.base}/admin/node", timeout=10).json()
        assert node["control"]["policy"] == "pi" and node["cpu_cores"] == 1.5


def test_identify_measures_a_positive_gain_near_the_model_based_one(tmp_path):
    # The low step at 0.1 core: at 0.3 the 2 ms model at 40 requests a second never used up its
    # CFS quota, both steps ran at full speed, and which mean came out lower was noise.
    _config(tmp_path, policy="fixed")
    with run_gateway(tmp_path / "config.toml") as gateway:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "identify",
                gateway.base,
                "--model",
                "busy",
                "--rate",
                "40",
                "--cores",
                "0.1,0.9",
                "--seconds",
                "6",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        low, high = result["steps"]
        assert low["mean_rt_ms"] > high["mean_rt_ms"]  # more cores answered faster
        assert result["gain"] > 0
        assert "plant = { gain" in done.stderr
        # The model was handed back to its policy.
        assert gateway.admin("busy")["pinned_cores"] is None


async def test_a_step_under_two_seconds_is_measured_over_its_last_period_only():
    """--seconds 1: the last half of the step is under one period, yet one period is measured (the
    slice history[-0:] took the whole history, every step before this one included)."""
    earlier = [{"requests": 100, "mean_rt_ms": 50.0}] * 9  # before this step: other loads, other cores
    history = [*earlier, {"requests": 5, "mean_rt_ms": 10.0}]

    async def pin(request: web.Request) -> web.Response:
        return web.json_response({"pinned_cores": (await request.json())["cores"]})

    async def infer(request: web.Request) -> web.Response:
        return web.json_response({"outputs": []})

    async def described(request: web.Request) -> web.Response:
        return web.json_response({"name": "m", "period_s": 1.0, "history": history})

    app = web.Application()
    app.router.add_put("/admin/models/m/cores", pin)
    app.router.add_post("/v2/models/m/infer", infer)
    app.router.add_get("/admin/models/m/history", described)
    async with stand_in(app) as base, aiohttp.ClientSession() as session:
        step = await _step(session, base, "m", 0.5, b"{}", argparse.Namespace(rate=5.0, seconds=1.0))
    assert step == {"cores": 0.5, "requests": 5, "mean_rt_ms": 10.0}
