"""Symphony's autoscaling signals (Section 4.4): the arithmetic, the sliding window on a fake
clock, and the four gauges of a running gateway with an emulated GPU."""

from __future__ import annotations

import re
import shutil

import pytest
import requests

from gateway.gpu_cluster import GpuClusterWindow, ended_out_of_slo
from schedulers.autoscale import BAD_RATE_THRESHOLD, scaling_signal
from tests.helpers import run_gateway


# -- the arithmetic -----------------------------------------------------------------------------
def test_a_bad_rate_over_the_threshold_asks_for_n_r_over_one_minus_r_gpus():
    signal = scaling_signal(4, bad_rate=0.2, idle_fraction=0.0)
    assert signal.gpus_to_add == pytest.approx(4 * 0.2 / 0.8)  # offered load 1.25x the peak goodput
    assert signal.gpus_to_release == 0.0


def test_a_bad_rate_under_the_threshold_asks_for_none():
    assert scaling_signal(4, bad_rate=BAD_RATE_THRESHOLD / 2, idle_fraction=0.0).gpus_to_add == 0.0
    assert scaling_signal(4, bad_rate=BAD_RATE_THRESHOLD, idle_fraction=0.0).gpus_to_add == 0.0


def test_an_idle_fraction_releases_n_f_gpus():
    signal = scaling_signal(8, bad_rate=0.0, idle_fraction=0.25)
    assert (signal.gpus_to_add, signal.gpus_to_release) == (0.0, 2.0)


# -- what counts as bad -------------------------------------------------------------------------
def test_requests_out_of_their_slo_are_bad_and_those_that_say_nothing_of_capacity_do_not_count():
    assert ended_out_of_slo("success", 90.0, 100.0) is False
    assert ended_out_of_slo("success", 110.0, 100.0) is True  # answered, but late
    for outcome in ("refused_deadline", "queue_full", "timeout", "executor_failed"):
        assert ended_out_of_slo(outcome, None, 100.0) is True
    for outcome in ("invalid", "too_large", "model_error", "client_gone", "shutdown"):
        assert ended_out_of_slo(outcome, None, 100.0) is None


# -- the window, on a fake clock ----------------------------------------------------------------
def test_the_idle_fraction_comes_from_the_batches_busy_intervals_within_the_period():
    window = GpuClusterWindow(opened_at=0.0, period_s=10.0)
    window.batch_started("gpu-0", 1.0)
    window.batch_ended("gpu-0", 3.0)
    window.batch_started("gpu-1", 2.0)
    window.batch_ended("gpu-1", 4.0)
    assert window.idle_fraction(10.0, gpus=2) == pytest.approx(1 - 4 / 20)
    # The window slides: at 12.5 it starts at 2.5, so only 0.5 s of gpu-0's batch is in it.
    assert window.busy_s(12.5) == pytest.approx(0.5 + 1.5)
    assert window.idle_fraction(12.5, gpus=2) == pytest.approx(1 - 2 / 20)
    # Old batches leave it altogether; a batch still running counts up to now.
    window.batch_started("gpu-0", 15.0)
    assert window.idle_fraction(16.0, gpus=2) == pytest.approx(1 - 1 / 20)
    window.batch_ended("gpu-0", 16.5)
    assert window.idle_fraction(30.0, gpus=2) == 1.0


def test_a_window_younger_than_its_period_is_measured_over_its_age():
    window = GpuClusterWindow(opened_at=100.0, period_s=10.0)
    assert window.idle_fraction(100.0, gpus=1) == 1.0  # nothing to measure yet
    window.batch_started("gpu-0", 100.0)
    window.batch_ended("gpu-0", 101.0)
    assert window.idle_fraction(102.0, gpus=1) == pytest.approx(0.5)  # busy 1 s of 2, not of 10


def test_the_bad_rate_counts_the_requests_that_ended_within_the_period():
    window = GpuClusterWindow(opened_at=0.0, period_s=10.0)
    assert window.bad_rate(0.5) == 0.0  # none ended: nothing was bad
    for at, bad in ((1.0, False), (2.0, True), (3.0, True), (4.0, False)):
        window.request_ended(at, bad)
    assert window.bad_rate(5.0) == pytest.approx(0.5)
    assert window.bad_rate(11.5) == pytest.approx(2 / 3)  # the one at 1.0 has left the window
    assert window.bad_rate(14.5) == 0.0


# -- a running gateway --------------------------------------------------------------------------
GAUGES = ("gateway_gpu_bad_rate", "gateway_gpu_idle_fraction", "gateway_gpus_to_add", "gateway_gpus_to_release")


def scaling_gauges(metrics: str) -> dict[str, float]:
    values = {}
    for name in GAUGES:
        match = re.search(rf"^{name} (\S+)$", metrics, re.MULTILINE)
        assert match, f"{name} is not on /metrics"
        values[name] = float(match.group(1))
    return values


def _config(folder, example_models):
    """One emulated GPU. cnn_small: 200 ms a batch on it, served in SLO; mlp: an SLA no device
    can meet, so every request of it is refused at admission (bad)."""
    for name in ("mlp", "cnn_small"):
        shutil.copy(example_models / f"{name}.onnx", folder / f"{name}.onnx")
    (folder / "gpu.csv").write_text("model,alpha_ms,beta_ms\nmlp,0.5,20.0\ncnn_small,0.0,200.0\n")
    path = folder / "config.toml"
    path.write_text(
        """
[node]
cpu_cores = 1.0
gpus = [0]

[gpu]
executor = "emulated"
profile = "gpu.csv"
policy = "work_conserving"

[control]
policy = "fixed"

[models.mlp]
path = "mlp.onnx"
sla_ms = 0.01
drop_late = true
cpu = { cores = 0.5, threads = 1 }

[models.cnn_small]
path = "cnn_small.onnx"
sla_ms = 5000
max_batch_size = 4
cpu = { cores = 0.5, threads = 1 }
"""
    )
    return path


def test_metrics_carry_the_gpu_clusters_autoscaling_signals(tmp_path, example_models):
    with run_gateway(_config(tmp_path, example_models)) as gateway:
        idle = scaling_gauges(gateway.metrics())
        # No load: the GPU has run nothing, nothing was bad; the one GPU could go.
        assert idle == {
            "gateway_gpu_bad_rate": 0.0,
            "gateway_gpu_idle_fraction": 1.0,
            "gateway_gpus_to_add": 0.0,
            "gateway_gpus_to_release": 1.0,
        }

        image = {"inputs": [{"name": "x", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [0.1] * 3072}]}
        gpu_ms = 0.0
        for _ in range(7):
            response = requests.post(f"{gateway.base}/v2/models/cnn_small/infer", json=image, timeout=30)
            assert response.status_code == 200, response.text
            parameters = response.json()["parameters"]
            assert parameters["executed_on"] == "gpu:0"  # the GPU is free at each arrival
            gpu_ms += parameters["compute_ms"]
        hopeless = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.1] * 512}]}
        for _ in range(3):
            assert requests.post(f"{gateway.base}/v2/models/mlp/infer", json=hopeless, timeout=30).status_code == 503

        loaded = scaling_gauges(gateway.metrics())
        # 3 of 10 requests ended out of their SLO: r = 0.3 asks for 1 x 0.3 / 0.7 GPUs more.
        assert loaded["gateway_gpu_bad_rate"] == pytest.approx(0.3)
        assert loaded["gateway_gpus_to_add"] == pytest.approx(0.3 / 0.7)
        # The GPU was busy at least for the batches it held (7 x 200 ms) within a window of at
        # most 10 s, and idle otherwise; one GPU, so N f = f.
        idle_fraction = loaded["gateway_gpu_idle_fraction"]
        assert 0.0 < idle_fraction <= 1 - gpu_ms / 1000 / 10
        assert loaded["gateway_gpus_to_release"] == pytest.approx(idle_fraction)
