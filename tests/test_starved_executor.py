"""A starved executor is not idle (issue bug 3): the PI controller raises it within two periods.

The PP-OCR text detector at its 0.1-core floor, four clients each sending a 1280x1280 image: at
0.1 core no request completes for seconds. Before, a period with no completion read as idle
(error -1) and the demand stayed at the floor while the first answers took 5 s against a 1 s SLA.
The control loop now sees the work it cannot see completing: the requests queued for or running
on the executor, and the age of the oldest.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time

import numpy as np
import requests
import tritonclient.http as triton

from tests.cluster import wait_for
from tests.helpers import period_closed, run_gateway

FLOOR = 0.1


def test_a_starved_executor_gets_more_cores_within_two_periods(tmp_path, example_models):
    shutil.copy(example_models / "ppocr_det.onnx", tmp_path / "ppocr_det.onnx")
    (tmp_path / "config.toml").write_text(
        f"""
[server]
drain_timeout_s = 1
[node]
cpu_cores = 2.0
[control]
policy = "pi"
[models.ppocr_det]
path = "ppocr_det.onnx"
sla_ms = 1000
max_batch_size = 4
cpu = {{ cores = {FLOOR}, min_cores = {FLOOR}, max_cores = 2.0, threads = 1 }}
"""
    )
    with run_gateway(tmp_path / "config.toml") as gateway:
        history_url = f"{gateway.base}/admin/models/ppocr_det/history"
        time.sleep(1.5)  # a period or two at rest: the demand sits at the floor
        image = np.random.default_rng(0).random((1, 3, 1280, 1280), dtype=np.float32)

        def client() -> None:
            tensor = triton.InferInput("x", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            # Cut short when the gateway stops: only the control loop is under test.
            with contextlib.suppress(Exception):
                triton.InferenceServerClient(gateway.url, network_timeout=60).infer("ppocr_det", [tensor])

        # The burst begins as a period begins: begun at a fixed time, it could land at a
        # period's end, its requests counted in the next one (as test_burst_at_floor's did).
        before = period_closed(history_url)
        assert before[-1]["cores"] == FLOOR
        for thread in [threading.Thread(target=client, daemon=True) for _ in range(4)]:
            thread.start()
        wait_for(lambda: len(requests.get(history_url, timeout=10).json()["history"]) >= len(before) + 3, 10, "three periods")
        after = requests.get(history_url, timeout=10).json()["history"][len(before) :]
    print([(h["requests"], h["demanded_cores"], h["cores"]) for h in after])
    assert len(after) >= 3
    # after[0] closes the period the burst began in; after[1] and after[2] are the two that
    # follow. No request completes in them, yet the controller asks for more at once and keeps
    # asking.
    assert all(h["requests"] == 0 for h in after[:3]), "a request completed: the executor was not starved"
    assert after[1]["demanded_cores"] > FLOOR
    assert after[2]["cores"] >= 2 * FLOOR
