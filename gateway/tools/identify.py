"""``gateway identify``: a step test of one model on a running gateway, to measure k.

It pins the model's executor at the low core allocation under an open-loop Poisson load, then
at the high one under the same load, reads each step's mean response time from the admin
history (the last part of each step, after the queue has settled), hands the model back to its
policy, and prints k (``controllers.identification``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from typing import Any

import aiohttp
import numpy as np

from controllers.identification import StepPoint, gain_from_step
from gateway.tools.arguments import positive_float, positive_floats, refuse_too_many_arrivals, share
from gateway.tools.bench import arrival_times, open_loop, request_body


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="gateway base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--rate", type=positive_float, required=True, help="requests/s held through both steps")
    parser.add_argument("--cores", type=core_pair, default=(0.5, 1.0), help="LOW,HIGH core allocations")
    parser.add_argument("--seconds", type=positive_float, default=8.0, help="seconds per step (the last half is measured)")
    parser.add_argument("--setpoint-ratio", type=share, default=0.8, help="alpha of the controller")
    parser.add_argument("--token", help="the gateway's admin token, where it has one")


def core_pair(text: str) -> tuple[float, float]:
    """LOW,HIGH: two core allocations, the second larger (k is the slope between them)."""
    values = positive_floats(text)
    if len(values) != 2 or values[0] >= values[1]:
        raise argparse.ArgumentTypeError(f"{text!r} is not LOW,HIGH: two core counts over 0, the second larger")
    return values[0], values[1]


def measured_periods(seconds: float, period_s: float) -> int:
    """The control periods of a step's last half, where its queue has settled: at least one (a
    slice of none, history[-0:], would be the whole history, every step before this one too)."""
    return max(1, int(seconds / 2 / period_s))


async def _step(
    session: aiohttp.ClientSession, base: str, model: str, cores: float, body: bytes, args: argparse.Namespace
) -> dict:
    async with session.put(f"{base}/admin/models/{model}/cores", json={"cores": cores}) as response:
        if response.status != 200:
            raise SystemExit(f"gateway identify: pinning {cores} cores failed: {await response.text()}")
    times = arrival_times([(args.rate, args.seconds)], random.Random(0))
    await open_loop(session, f"{base}/v2/models/{model}/infer", body, times, None)
    async with session.get(f"{base}/admin/models/{model}/history") as response:
        described = await response.json()
    periods = measured_periods(args.seconds, float(described.get("period_s", 1.0)))
    measured = [h for h in described["history"][-periods:] if h["requests"]]
    served = sum(h["requests"] for h in measured)
    if not served:
        raise SystemExit("gateway identify: no request was served in the measured part of the step")
    return {
        "cores": cores,
        "requests": served,
        "mean_rt_ms": sum(h["mean_rt_ms"] * h["requests"] for h in measured) / served,
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    base = args.url.rstrip("/")
    low, high = args.cores
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(f"{base}/v2/models/{args.model}") as response:
            if response.status != 200:
                raise SystemExit(f"gateway identify: {await response.text()}")
            metadata = await response.json()
        async with session.get(f"{base}/admin/models/{args.model}") as response:
            if response.status != 200:  # 401 without the admin token
                raise SystemExit(f"gateway identify: the admin API answered {response.status}: {await response.text()}")
            sla_ms = (await response.json())["sla_ms"]
        body = request_body(metadata, {}, np.random.default_rng(0))
        try:
            points = [await _step(session, base, args.model, cores, body, args) for cores in (low, high)]
        finally:
            async with session.put(f"{base}/admin/models/{args.model}/cores", json={"cores": None}):
                pass
    k = gain_from_step(
        StepPoint(low, points[0]["mean_rt_ms"]), StepPoint(high, points[1]["mean_rt_ms"]), sla_ms, args.setpoint_ratio
    )
    return {"model": args.model, "sla_ms": sla_ms, "steps": points, "gain": k}


def run(args: argparse.Namespace) -> int:
    refuse_too_many_arrivals("identify", [(args.rate, args.seconds)])  # drawn for each step
    try:
        result = asyncio.run(_run(args))
    except (aiohttp.ClientError, ValueError) as error:  # ValueError: a URL aiohttp cannot use
        raise SystemExit(f"gateway identify: {args.url}: {error or type(error).__name__}") from None
    print(json.dumps(result, indent=2))
    print(
        f"\nk = {result['gain']:.2f} per core: put `plant = {{ gain = {result['gain']:.2f} }}` under [models.{result['model']}]"
        " to start the PI controller from it",
        file=sys.stderr,
    )
    return 0
