"""``gateway bench``: load against a running gateway, open-loop or closed-loop.

Open loop (``--rate`` or ``--steps``): requests leave at Poisson arrival times whatever the
server does, and each is timed from its arrival time, so queueing shows up in the latencies
even when the generator falls behind (no coordinated omission). Closed loop
(``--concurrency``): N clients, each sending its next request when the last one returned.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from tqdm import tqdm

from executors.tensors import KSERVE_TO_NUMPY
from gateway.tools.arguments import (
    json_output_file,
    positive_float,
    positive_int,
    rate_steps,
    refuse_too_many_arrivals,
    seed,
    tensor_shape,
)

# Open-loop runs stop adding requests past this many outstanding, so a dead server cannot
# make the generator eat all memory; such requests are counted as "dropped by client".
MAX_OUTSTANDING = 20_000
# The most a request may take before it is given up and counted an error ("TimeoutError"): a
# server that never answers must not hold the run, nor lose the request from the counts.
CLIENT_TIMEOUT_S = 300.0


@dataclass
class Outcome:
    latencies_ms: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)  # perf_counter time each answered request was sent (or due)
    statuses: dict[str, int] = field(default_factory=dict)
    dropped: int = 0

    def add(self, status: str, latency_ms: float, sent: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == "200":
            self.latencies_ms.append(latency_ms)
            self.sent.append(sent)


def timeout_ms(text: str) -> float:
    """A request's own timeout: from 1 µs (the protocol's grain) to a day (1e300 ms was sent as an
    integer the gateway cannot read, and every request was refused 400)."""
    value = positive_float(text)
    if not 0.001 <= value <= 86_400_000:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0.001 to 86400000 ms")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="gateway base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=positive_float, help="open loop: Poisson arrivals at this many requests/s")
    load.add_argument("--steps", type=rate_steps, help="open loop: RATE:SECONDS,RATE:SECONDS,... a step schedule of rates")
    load.add_argument("--concurrency", type=positive_int, help="closed loop: this many clients")
    parser.add_argument("--duration", type=positive_float, default=10.0, help="seconds (with --rate or --concurrency)")
    parser.add_argument(
        "--shape", type=tensor_shape, action="append", default=[], help="NAME=D1,D2,... for inputs with free dimensions (else 1)"
    )
    parser.add_argument(
        "--timeout-ms", type=timeout_ms, help="each request's own timeout (the protocol's timeout parameter), 0.001 to 86400000"
    )
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument(
        "--output", type=json_output_file, help="write the results as JSON here, and a report beside it (the same name, .png)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def arrival_times(steps: list[tuple[float, float]], rng: random.Random) -> list[float]:
    """Poisson arrival times (seconds from start) for a schedule of (rate, duration) steps."""
    times: list[float] = []
    start = 0.0
    for rate, seconds in steps:
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= start + seconds:
                break
            times.append(t)
        start += seconds
    return times


def request_body(
    metadata: dict[str, Any], shapes: dict[str, list[int]], rng: np.random.Generator, timeout_ms: float | None = None
) -> bytes:
    inputs = []
    for spec in metadata["inputs"]:
        shape = shapes.get(spec["name"]) or [1 if d == -1 else d for d in spec["shape"]]
        dtype = KSERVE_TO_NUMPY[spec["datatype"]]
        if spec["datatype"] == "BYTES":
            data: list[Any] = ["x"] * int(np.prod(shape))
        elif dtype.kind == "f":
            data = rng.standard_normal(int(np.prod(shape))).astype(dtype).tolist()
        elif dtype.kind == "b":
            data = (rng.random(int(np.prod(shape))) > 0.5).tolist()
        else:
            data = rng.integers(0, 2, int(np.prod(shape))).tolist()
        inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"], "data": data})
    body: dict[str, Any] = {"inputs": inputs}
    if timeout_ms is not None:
        # Microseconds, as Triton's, rounded up: 0.0001 ms was sent as 0, which is no timeout at all.
        body["parameters"] = {"timeout": math.ceil(timeout_ms * 1000)}
    return json.dumps(body).encode()


async def _send(session: aiohttp.ClientSession, url: str, body: bytes, outcome: Outcome, scheduled: float | None = None) -> None:
    """One request; its latency runs from ``scheduled`` (a perf_counter time) when it has one, else from now."""
    started = time.perf_counter() if scheduled is None else scheduled
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
            await response.read()
            status = str(response.status)
    except (aiohttp.ClientError, TimeoutError) as error:
        # No answer (refused, cut, or past CLIENT_TIMEOUT_S; asyncio's timeout is no ClientError):
        # counted by its kind among the statuses, so every request sent is in the counts.
        status = type(error).__name__
    outcome.add(status, (time.perf_counter() - started) * 1000, started)


async def open_loop(session: aiohttp.ClientSession, url: str, body: bytes, times: list[float], bar: tqdm | None) -> Outcome:
    """Send a request at each of ``times`` (seconds from now), whatever the server does.

    Each latency runs from when the request was due, not from when it left: when this
    generator falls behind its schedule (a busy loop, a slow progress bar, too many requests
    to send), the lag is part of what a client of a server that slow would have waited,
    and leaving it out would hide the queueing (coordinated omission).
    """
    outcome = Outcome()
    outstanding: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    for t in times:
        due = start + t
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(outstanding) >= MAX_OUTSTANDING:
            outcome.dropped += 1
            continue
        task = asyncio.create_task(_send(session, url, body, outcome, scheduled=due))
        outstanding.add(task)
        task.add_done_callback(outstanding.discard)
        if bar is not None:
            bar.update(1)
    if outstanding:
        await asyncio.wait(outstanding)
    return outcome


async def _closed_loop(
    session: aiohttp.ClientSession, url: str, body: bytes, clients: int, seconds: float, bar: tqdm | None
) -> Outcome:
    outcome = Outcome()
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            await _send(session, url, body, outcome)
            if bar is not None:
                bar.update(1)

    await asyncio.gather(*(client() for _ in range(clients)))
    return outcome


def summarize(outcome: Outcome, elapsed_s: float) -> dict[str, Any]:
    latencies = np.asarray(outcome.latencies_ms)
    ok = len(latencies)

    def pct(q: float) -> float | None:
        return round(float(np.percentile(latencies, q)), 3) if ok else None

    return {
        "elapsed_s": round(elapsed_s, 3),
        "requests": sum(outcome.statuses.values()),
        "succeeded": ok,
        "statuses": outcome.statuses,
        "errors": sum(n for status, n in outcome.statuses.items() if not status.isdigit()),  # no HTTP answer
        "dropped_by_client": outcome.dropped,
        "throughput_rps": round(ok / elapsed_s, 2) if elapsed_s else 0.0,
        "latency_ms": {
            "mean": round(float(latencies.mean()), 3) if ok else None,
            "p50": pct(50),
            "p90": pct(90),
            "p99": pct(99),
            "max": pct(100),
        },
    }


async def _run(args: argparse.Namespace) -> tuple[dict[str, Any], Callable[[], None] | None]:
    """The run's results, and what draws its report (with --output)."""
    base = args.url.rstrip("/")
    shapes = dict(args.shape)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as session:
        try:
            async with session.get(f"{base}/v2/models/{args.model}") as response:
                if response.status != 200:
                    raise SystemExit(
                        f"gateway bench: GET /v2/models/{args.model} answered {response.status}: {await response.text()}"
                    )
                metadata = await response.json()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise SystemExit(f"gateway bench: cannot reach {base}: {str(error) or type(error).__name__}") from None
        body = request_body(metadata, shapes, np.random.default_rng(args.seed), args.timeout_ms)
        url = f"{base}/v2/models/{args.model}/infer"
        started = time.perf_counter()
        if args.concurrency:
            bar = None if args.quiet else tqdm(desc="requests", unit="req", file=sys.stderr)
            outcome = await _closed_loop(session, url, body, args.concurrency, args.duration, bar)
        else:
            steps = args.steps or [(args.rate, args.duration)]
            times = arrival_times(steps, random.Random(args.seed))
            bar = None if args.quiet else tqdm(total=len(times), desc="requests", unit="req", file=sys.stderr)
            outcome = await open_loop(session, url, body, times, bar)
        if bar is not None:
            bar.close()
        result = summarize(outcome, time.perf_counter() - started)
        result["sla_ms"] = await _sla_ms(session, base, args.model)
    result["mode"] = "closed" if args.concurrency else "open"
    result["model"] = args.model
    if not args.output:
        return result, None

    def draw() -> None:
        from gateway.tools.bench_report import write_report

        schedule = ",".join(f"{rate:g}:{seconds:g}" for rate, seconds in args.steps or ())
        load = f"{args.concurrency} clients" if args.concurrency else (schedule or f"{args.rate:g} req/s")
        latency = result["latency_ms"]
        write_report(
            Path(args.output).with_suffix(".png"),
            args.model,
            [t - started for t in outcome.sent],
            outcome.latencies_ms,
            result["sla_ms"],
            f"gateway bench {args.model}, {result['mode']} loop ({load}): {result['throughput_rps']} req/s, "
            f"p50 {latency['p50']} ms, p99 {latency['p99']} ms, {result['succeeded']}/{result['requests']} ok",
        )

    return result, draw


async def _sla_ms(session: aiohttp.ClientSession, base: str, model: str) -> float | None:
    """The model's SLA, from its Triton configuration's parameters (None if it does not say, or
    the gateway is gone: the run's results are kept all the same)."""
    try:
        async with session.get(f"{base}/v2/models/{model}/config") as response:
            if response.status != 200:
                return None
            config = await response.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    value = config.get("parameters", {}).get("sla_ms", {}).get("string_value")
    return float(value) if value is not None else None


def run(args: argparse.Namespace) -> int:
    if not args.concurrency:
        refuse_too_many_arrivals("bench", args.steps or [(args.rate, args.duration)])
    result, draw = asyncio.run(_run(args))
    latency = result["latency_ms"]
    print(
        f"{result['model']}: {result['succeeded']}/{result['requests']} ok in {result['elapsed_s']} s, "
        f"{result['throughput_rps']} req/s, p50 {latency['p50']} ms, p90 {latency['p90']} ms, p99 {latency['p99']} ms, "
        f"{result['errors']} without an answer, statuses {result['statuses']}"
    )
    if args.output:
        with open(args.output, "w") as handle:
            json.dump(result, handle, indent=2)
    if draw is not None:
        # After the results are written: a report that cannot be drawn or saved loses nothing else.
        try:
            draw()
        except (OSError, ValueError) as error:
            print(f"gateway bench: the report {Path(args.output).with_suffix('.png')} was not written: {error}", file=sys.stderr)
            return 1
    return 0
