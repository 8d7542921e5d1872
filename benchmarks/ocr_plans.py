"""The OCR pipeline (examples/ocr.toml) planned four ways and served as planned, side by side in one
run: ours, FA2 alone, Harpagon alone and an even split of the SLA, at two rates and two
end-to-end SLAs.

1. For each (rate, SLA, planner): `gateway plan --sample IMAGE --apply` on a copy of the config
   with the pipeline's SLA set (each model step measured on the image's real step inputs; the
   planner's own runtime kept), then serve that copy with the `fixed` control
   policy (the plan's cores are what is enforced), send Poisson arrivals of images with text
   for ``--duration`` seconds, and count: requests over the SLA (ROMA's violations per request,
   and the p99 against the SLA, Symphony's measure), errors, and the core-seconds enforced on the
   three models' executors over the load (the admin API's core_seconds).

Writes benchmarks/work/ocr_plans.json and prints a Markdown table.

    .venv/bin/python benchmarks/ocr_plans.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import EXAMPLES, run_gateway  # noqa: E402
from tests.test_ocr_pipeline import render  # noqa: E402

WORK = ROOT / "benchmarks" / "work"
MODELS = ("ppocr_det", "ppocr_cls", "ppocr_rec")
POLICIES = ("ours", "fa2", "harpagon", "even")
NODE_CORES = 2.0  # examples/ocr.toml's [node] cpu_cores: a plan over it is not served here
LINES = [["Hello World 2026"], ["SLA gateway", "plans its budgets"], ["ONNX Runtime", "KServe v2", "0123456789"]]


def images() -> list[tuple[int, bytes]]:
    """Binary KServe bodies of a few images with text (the JSON header, then the raw pixels)."""
    bodies = []
    for lines in LINES:
        image = render(lines)
        size = {"binary_data_size": image.size}
        tensor = {"name": "image", "datatype": "UINT8", "shape": list(image.shape), "parameters": size}
        header = json.dumps({"inputs": [tensor], "outputs": [{"name": "text"}]}).encode()
        bodies.append((len(header), header + image.tobytes()))
    return bodies


async def load(url: str, rate: float, duration_s: float, seed: int) -> list[tuple[int, float]]:
    """Poisson arrivals of the images; (status, response ms) of each, timed from when it was due."""
    import aiohttp

    bodies = images()
    rng = random.Random(seed)
    answers: list[tuple[int, float]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(due: float, body: tuple[int, bytes]) -> None:
            headers = {"Inference-Header-Content-Length": str(body[0]), "Content-Type": "application/octet-stream"}
            try:
                async with session.post(f"{url}/v2/models/ocr/infer", data=body[1], headers=headers) as response:
                    await response.read()
                    answers.append((response.status, (time.perf_counter() - due) * 1000))
            except aiohttp.ClientError:
                answers.append((0, (time.perf_counter() - due) * 1000))

        tasks, start, t = [], time.perf_counter(), 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= duration_s:
                break
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(start + t, bodies[len(tasks) % len(bodies)])))
        await asyncio.gather(*tasks)
    return answers


def core_seconds(base: str) -> float:
    return sum(requests.get(f"{base}/admin/models/{m}", timeout=10).json()["stats"]["core_seconds"] for m in MODELS)


def plan(config: Path, sample: Path, rate: float, policy: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "gateway.cli", "plan", str(config), "--rate", str(rate), "--sample", str(sample)]
    done = subprocess.run(argv + ["--policy", policy, "--json", "--apply"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip()[-300:]}
    return json.loads(done.stdout)


def with_sla(source: Path, target: Path, sla_ms: float) -> Path:
    import tomlkit

    document = tomlkit.parse(source.read_text())
    document["pipelines"]["ocr"]["sla_ms"] = sla_ms
    document["control"]["policy"] = "fixed"  # the plan's cores, enforced as planned
    target.write_text(tomlkit.dumps(document))
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="4,8")
    parser.add_argument("--slas-ms", default="400,1000")
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="ocr-plans-"))
    shutil.copytree(EXAMPLES / "models", folder / "models")
    shutil.copy(EXAMPLES / "ocr.py", folder / "ocr.py")
    base_config = with_sla(EXAMPLES / "ocr.toml", folder / "ocr.toml", 5000)
    sample = folder / "sample.png"
    from PIL import Image

    Image.fromarray(render(LINES[1])).save(sample)
    rows: list[dict[str, Any]] = []
    for rate in (float(r) for r in args.rates.split(",")):
        for sla_ms in (float(s) for s in args.slas_ms.split(",")):
            plans = {}
            for policy in POLICIES:
                target = with_sla(base_config, folder / f"{policy}-{rate:g}-{sla_ms:g}.toml", sla_ms)
                plans[policy] = (target, plan(target, sample, rate, policy))
            for policy, (target, planned) in plans.items():
                row: dict[str, Any] = {"rate": rate, "sla_ms": sla_ms, "policy": policy}
                if "error" in planned:
                    rows.append({**row, "error": planned["error"]})
                    print(rows[-1], file=sys.stderr)
                    continue
                row.update(planned_cost=planned["cost"], planner_ms=planned["planner_ms"], steps=planned["steps"])
                # What the plan predicts for the models' path, plus the function steps measured on the sample.
                functions_ms = sum(planned.get("functions_ms", {}).values())
                row["planned_ms"] = round(max(p["worst_case_ms"] for p in planned["paths"]) + functions_ms, 1)
                if planned["cost"] > NODE_CORES:
                    rows.append({**row, "error": f"needs {planned['cost']:g} cores, over the node's {NODE_CORES:g}"})
                    print(rows[-1], file=sys.stderr)
                    continue
                with run_gateway(target) as gateway:
                    asyncio.run(load(gateway.base, rate, 3.0, seed=1))  # warm-up
                    before = core_seconds(gateway.base)
                    answers = asyncio.run(load(gateway.base, rate, args.duration, seed=2))
                    used = core_seconds(gateway.base) - before
                ok = [ms for status, ms in answers if status == 200]
                row.update(
                    requests=len(answers),
                    errors=len(answers) - len(ok),
                    over_sla=sum(ms > sla_ms for status, ms in answers if status == 200) + len(answers) - len(ok),
                    p99_ms=round(float(np.percentile(ok, 99)), 1) if ok else None,
                    core_seconds=round(used, 2),
                )
                rows.append(row)
                print(rows[-1], file=sys.stderr)
    (WORK / "ocr_plans.json").write_text(json.dumps(rows, indent=2))
    print(
        "| rate (req/s) | SLA (ms) | planner | planned cores | planner (ms) | planned latency (ms) "
        "| requests | over SLA | p99 (ms) | core-seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            cost = row.get("planned_cost", "")
            print(f"| {row['rate']:g} | {row['sla_ms']:g} | {row['policy']} | {cost} | {row.get('planner_ms', '')} "
                  f"| {row.get('planned_ms', '')} | not served: {row['error'][:70]} | | | |")  # fmt: skip
            continue
        print(
            f"| {row['rate']:g} | {row['sla_ms']:g} | {row['policy']} | {row['planned_cost']} | {row['planner_ms']} "
            f"| {row['planned_ms']} | {row['requests']} | {row['over_sla']} | {row['p99_ms']} | {row['core_seconds']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
