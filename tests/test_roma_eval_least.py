"""benchmarks/roma_eval.py's least core-seconds: the floor counts as the CFS quota enforces it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from roma_eval import ENFORCED_FLOOR, floor_or_work  # noqa: E402

from executors.limits import MIN_QUOTA_US  # noqa: E402


def row(*cpu_s_per_period: float | None, start: float = 100.0) -> dict:
    """A run of one model whose executor used ``cpu_s_per_period`` in consecutive 1 s periods."""
    history = [{"t": start + 1 + i, "cpu_s": cpu_s} for i, cpu_s in enumerate(cpu_s_per_period)]
    return {"clock_start": start, "per_model": {"upconv_xl": {"history": history}}}


def test_a_quiet_period_counts_the_floor_as_the_quota_enforces_it():
    # 0.05 core is configured: the least CFS quota, 1 ms, every 20 ms.
    assert ENFORCED_FLOOR == pytest.approx(MIN_QUOTA_US / 20_000) == pytest.approx(0.05)
    # Two quiet seconds at the floor, one busy second at the CPU time it used.
    assert floor_or_work(row(0.01, 0.0, 0.3), duration_s=3) == pytest.approx(0.05 + 0.05 + 0.3)


def test_only_the_run_itself_counts_and_older_records_give_none():
    # Periods after the run's duration are not its CPU work.
    assert floor_or_work(row(0.2, 0.2, 0.9, 0.9), duration_s=2) == pytest.approx(0.4)
    # A history without CPU time (results recorded before it was kept) has no bound.
    assert floor_or_work({"clock_start": 0.0, "per_model": {"m": {"history": [{"t": 1.0}]}}}, duration_s=1) is None
