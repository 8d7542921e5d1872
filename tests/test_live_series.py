"""The live page's per-second series (gateway/ui/series.py) on a fake clock: exact values, bounded memory."""

from __future__ import annotations

import pytest

from gateway.ui.series import SAMPLES_PER_SECOND, LiveSeries, ModelSecond, PeriodOf, SecondRing


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def test_a_ring_holds_one_bucket_a_second_and_forgets_the_oldest():
    ring: SecondRing[list[int]] = SecondRing(list, seconds=3)
    for t in (10.0, 10.5, 11.2, 12.9):
        bucket = ring.at(t)
        assert bucket is not None
        bucket.append(int(t * 10))
    assert ring.get(10) == [100, 105] and ring.get(11) == [112] and ring.get(12) == [129]
    # The current second and the three before it fit; second 14 takes second 10's slot.
    ring.at(13.0).append(130)  # type: ignore[union-attr]
    assert ring.get(10) == [100, 105]
    ring.at(14.0).append(140)  # type: ignore[union-attr]
    assert ring.get(10) is None and ring.get(14) == [140]
    # Too old to keep: nothing is opened, and no newer second is overwritten.
    assert ring.at(10.7) is None
    assert ring.get(14) == [140]
    # The complete seconds before now, oldest first; the current one is not over.
    assert ring.last(14.4, 3) == [(11, [112]), (12, [129]), (13, [130])]
    assert ring.last(14.4, 99) == ring.last(14.4, 3)  # never more than it holds
    with pytest.raises(ValueError):
        SecondRing(list, seconds=0)


def test_a_long_gap_leaves_empty_seconds():
    ring: SecondRing[list[int]] = SecondRing(list, seconds=4)
    ring.at(1.0).append(1)  # type: ignore[union-attr]
    ring.at(9.5).append(9)  # type: ignore[union-attr]
    assert ring.last(10.0, 4) == [(6, None), (7, None), (8, None), (9, [9])]


def test_requests_are_counted_by_second_with_mean_p99_violations_and_outcomes():
    clock = FakeClock()
    series = LiveSeries(seconds=60)
    for rt in (10.0, 20.0, 30.0, 40.0):
        series.request_ended("m", clock.advance(0.1), "success", rt, 25.0, "cpu")
    series.request_ended("m", clock.advance(0.1), "success", 5.0, 25.0, "gpu:0")
    series.request_ended("m", clock.advance(0.1), "queue_full", None, 25.0, "cpu")
    series.request_ended("m", clock.now, "refused_deadline", None, 25.0, "cpu")
    series.request_ended("m", clock.now, "timeout", None, 25.0, "cpu")
    series.request_ended("m", clock.now, "executor_failed", None, 25.0, "cpu")
    series.request_ended("m", clock.now, "unloaded", None, 25.0, "cpu")  # refused: its model went away
    series.request_ended("m", clock.now, "model_error", None, 25.0, "cpu")  # the model failed on it
    series.request_ended("m", clock.now, "invalid", None, 25.0, "cpu")  # the client's mistake: no count
    clock.advance(1.0)  # second 1000 is over
    snapshot = series.snapshot(clock.now, 3, {"m": 25.0})
    assert snapshot["t"] == [-3, -2, -1]
    s = snapshot["models"]["m"]["series"]
    assert s["requests"] == [0, 0, 5]
    assert s["mean_rt_ms"] == [None, None, 21.0]
    assert s["p99_rt_ms"][-1] == pytest.approx(39.6)  # numpy's linear percentile of 5, 10, 20, 30, 40
    assert s["violations"] == [0, 0, 2]
    assert (s["refused"], s["timeouts"], s["failed"]) == ([0, 0, 3], [0, 0, 1], [0, 0, 2])
    assert (s["on_cpu"], s["on_gpu"]) == ([0, 0, 4], [0, 0, 1])


def test_the_sla_line_carries_the_last_known_sla_over_quiet_seconds():
    series = LiveSeries(seconds=60)
    series.request_ended("m", 100.2, "success", 10.0, 40.0, "cpu")
    series.queue("m", 102.5, 3, 250.0)  # the SLA was changed to 250 ms meanwhile
    s = series.snapshot(105.0, 6, {"m": 250.0, "idle": 80.0})["models"]
    # Before the first event the first known SLA; after each, the last known.
    assert s["m"]["series"]["sla_ms"] == [40.0, 40.0, 40.0, 250.0, 250.0, 250.0]
    assert s["m"]["series"]["queue_length"] == [None, None, None, 3, None, None]
    # A model that saw nothing shows its SLA now and no response times.
    assert s["idle"]["series"]["sla_ms"] == [80.0] * 6
    assert s["idle"]["series"]["mean_rt_ms"] == [None] * 6


def test_the_queue_keeps_the_longest_of_the_second():
    series = LiveSeries(seconds=60)
    for t, length in ((7.1, 2), (7.4, 9), (7.8, 1)):
        series.queue("m", t, length, 50.0)
    assert series.snapshot(8.0, 1, {"m": 50.0})["models"]["m"]["series"]["queue_length"] == [9]


def test_control_periods_give_cores_demanded_granted_and_used():
    series = LiveSeries(seconds=60)
    periods = {"a": PeriodOf(demanded=1.2, granted=0.8, cpu_s=0.4), "b": PeriodOf(demanded=0.3, granted=0.3, cpu_s=0.25)}
    series.control_period(50.3, 0.5, periods, {"a": 20.0, "b": 30.0})
    snapshot = series.snapshot(51.0, 1, {"a": 20.0, "b": 30.0})
    a = snapshot["models"]["a"]["series"]
    assert (a["demanded_cores"], a["granted_cores"], a["used_cores"]) == ([1.2], [0.8], [0.8])  # 0.4 s of CPU in 0.5 s
    assert snapshot["node"]["granted_cores"] == [1.1]
    assert snapshot["node"]["used_cores"] == [1.3]


def test_batches_count_by_size_per_model_and_per_gpu():
    series = LiveSeries(seconds=60)
    series.batch_done("m", "cpu-m", "cpu", 4, 20.1)
    series.batch_done("m", "gpu-0", "gpu:0", 4, 20.2)
    series.batch_done("m", "gpu-0", "gpu:0", 1, 21.2)
    series.batch_done("n", "gpu-1", "gpu:1", 8, 21.3)
    snapshot = series.snapshot(22.0, 5, {"m": 10.0, "n": 10.0}, gpus=["gpu-0", "gpu-1", "gpu-2"])
    assert snapshot["models"]["m"]["batch_sizes"] == {"1": 1, "4": 2}
    assert snapshot["gpus"]["gpu-0"]["batch_sizes"] == {"1": 1, "4": 1}
    assert snapshot["gpus"]["gpu-1"]["batch_sizes"] == {"8": 1}
    assert snapshot["gpus"]["gpu-2"] == {"busy": [0.0] * 5, "batch_sizes": {}}  # a GPU that ran nothing


def test_gpu_busy_time_is_split_over_the_seconds_it_spans():
    series = LiveSeries(seconds=60)
    series.gpu_busy("gpu-0", 10.75, 12.5)  # a quarter of second 10, all of 11, half of 12
    series.gpu_busy("gpu-0", 12.5, 12.75)
    busy = series.snapshot(14.0, 4, {}, gpus=["gpu-0"])["gpus"]["gpu-0"]["busy"]
    assert busy == [0.25, 1.0, 0.75, 0.0]


def test_symphony_signals_are_kept_per_period():
    series = LiveSeries(seconds=60)
    series.gpu_signals(3.5, 0.02, 0.4)
    node = series.snapshot(5.0, 2, {})["node"]
    assert (node["bad_rate"], node["idle_fraction"]) == ([0.02, None], [0.4, None])


def test_a_busy_second_keeps_a_bounded_evenly_spaced_sample():
    second = ModelSecond()
    count = SAMPLES_PER_SECOND * 5
    for i in range(count):
        second.observe(float(i))
    assert second.served == count and second.mean_ms == pytest.approx((count - 1) / 2)
    assert SAMPLES_PER_SECOND // 2 <= len(second.samples) < SAMPLES_PER_SECOND
    gaps = {b - a for a, b in zip(second.samples, second.samples[1:], strict=False)}
    assert gaps == {second.stride}  # evenly spaced
    assert second.p99_ms == pytest.approx(0.99 * count, rel=0.01)


def test_memory_is_bounded_by_the_ring_whatever_the_run_length():
    series = LiveSeries(seconds=10)
    clock = FakeClock(0.0)
    for _ in range(1000):
        series.request_ended("m", clock.advance(0.5), "success", 1.0, 5.0, "cpu")
    ring = series.models["m"]
    assert sum(slot is not None for slot in ring._slots) == 11  # the current second and the ten before it
    assert sum(series.snapshot(clock.now, 10, {"m": 5.0})["models"]["m"]["series"]["requests"]) == 20
