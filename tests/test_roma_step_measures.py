"""benchmarks/roma_step.py's measures of a recovery, on a hand-made run: the seconds after an SLA
change, each with a mean response time over or under the new SLA."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from roma_step import CHANGED_MODEL, recovery_periods, settle_periods, violations_after_recovery  # noqa: E402

OLD_SLA, NEW_SLA, CHANGE_S = 100.0, 50.0, 10


def run(means_ms: list[float]) -> dict:
    """An sla-change run whose second CHANGE_S + i has one answered request of ``means_ms[i]``,
    after ten seconds at 30 ms under the old SLA."""
    latencies = [30.0] * CHANGE_S + means_ms
    samples = [(second + 0.5, latency, 200) for second, latency in enumerate(latencies)]
    model = {"sla_ms": OLD_SLA, "samples": samples}
    return {"scenario": "sla-change", "change_s": CHANGE_S, "new_sla_ms": NEW_SLA, "per_model": {CHANGED_MODEL: model}}


def test_a_change_met_at_once_and_kept():
    row = run([40, 45, 30, 30])
    assert (recovery_periods(row, CHANGED_MODEL), settle_periods(row, CHANGED_MODEL)) == (0, 0)
    assert violations_after_recovery(row, CHANGED_MODEL) == 0


def test_back_under_in_two_periods_then_one_late_second():
    # Over the new SLA (yet under the old) for two seconds, under it, one late second, under again.
    row = run([80, 60, 40, 45, 55, 40, 30])
    assert recovery_periods(row, CHANGED_MODEL) == 2
    assert settle_periods(row, CHANGED_MODEL) == 5  # for good only after the late second
    assert violations_after_recovery(row, CHANGED_MODEL) == 1


def test_never_back_under():
    row = run([80, 70, 60])
    assert recovery_periods(row, CHANGED_MODEL) is None and settle_periods(row, CHANGED_MODEL) is None
    assert violations_after_recovery(row, CHANGED_MODEL) == 0
