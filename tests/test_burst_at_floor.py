"""A burst on a model at its floor is met within two periods (ours: the feedforward policy).

A real gateway, a real ONNX Runtime executor under a cgroup quota: upconv_m (a few ms of CPU a
request) sits idle at its floor (0.1 core, the default, and 0.05), then requests arrive
open-loop at BURST times what the floor serves, the rate derived from the model's time on this
machine (7 ms a request on the AMD EPYC of 2026-11-26: 57 requests a second at 0.1 core). A
fixed 80 a second was 0.57 core of work there, and with its one thread and the client and the
gateway beside it on two cores, the backlog of the first period drained too slowly on a noisier
CI machine (second period 273 ms against the 250 ms SLA). The period the burst lands in closes
with a backlog; the feed-forward sizes the cores from the measured arrival rate, CPU time per
request and backlog, so the next period already drains it, and the second period after the
burst is within the SLA.
ROMA's PI alone moves at most 4 K = 4 s / (alpha SLA), about 0.14 core a period here, and is
still under the 0.4 core of work (and the backlog) two periods on at the 0.1 floor.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import shutil
import time

import pytest
import requests

from tests.helpers import cpu_ms_per_request, period_closed, run_gateway

SLA_MS = 250.0
BURST = 4.0  # the burst's work, in multiples of the floor
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 1, 8, 8], "datatype": "FP32", "data": [0.5] * 64}]})


# 0.1 core is the product's default floor; 0.05 is enforced as 1 ms of CPU every 20 ms (executors/limits.py).
@pytest.mark.parametrize("floor", [0.1, 0.05])
def test_a_burst_on_a_model_at_its_floor_is_met_within_two_periods(tmp_path, example_models, floor):
    shutil.copy(example_models / "upconv_m.onnx", tmp_path / "upconv_m.onnx")
    rate = BURST * floor * 1000 / cpu_ms_per_request(tmp_path / "upconv_m.onnx")
    (tmp_path / "config.toml").write_text(
        f"""
[server]
drain_timeout_s = 1
[node]
cpu_cores = 1.5
[control]
policy = "feedforward"
[models.upconv_m]
path = "upconv_m.onnx"
sla_ms = {SLA_MS}
max_batch_size = 8
cpu = {{ cores = {floor}, min_cores = {floor}, max_cores = 1.5, threads = 1 }}
"""
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        url = f"{gateway.base}/v2/models/upconv_m/infer"
        history_url = f"{gateway.base}/admin/models/upconv_m/history"
        time.sleep(1.5)  # a period or two at rest: at the floor
        # The burst begins as a period begins: begun at a period's end, its first period would hold
        # a few arrivals and stay at the floor, and the backlog of the next would be counted against
        # the period sized after it (CI once saw 0 requests, 0.05 core, then 320 ms).
        before = period_closed(history_url)
        assert before[-1]["cores"] == floor

        def one() -> None:
            with contextlib.suppress(requests.RequestException):
                requests.post(url, data=BODY, headers={"Content-Type": "application/json"}, timeout=30)

        with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
            start = time.perf_counter()
            for i in range(int(rate * 4)):  # 4 s of arrivals at a fixed rate, open loop
                time.sleep(max(0.0, start + i / rate - time.perf_counter()))
                pool.submit(one)
            after = requests.get(history_url, timeout=10).json()["history"][len(before) :]
    print([(h["requests"], round(h["mean_rt_ms"] or 0), h["demanded_cores"], h["cores"]) for h in after])
    assert len(after) >= 3
    # after[0] closes the period the burst began in, at the floor; after[1] is the period after,
    # which the feed-forward has already sized; after[2], the second period, meets the SLA.
    assert after[1]["cores"] > 2 * floor
    assert after[2]["requests"] > 0 and after[2]["mean_rt_ms"] <= SLA_MS
