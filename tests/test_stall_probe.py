"""benchmarks/stall_probe.py: the machine's stalls and steal time, lined up with a benchmark's seconds."""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from stall_probe import Stalls, in_second_sent, in_window, probing  # noqa: E402


def test_a_seconds_stalls_are_read_from_the_probes_lines_on_the_benchmarks_clock():
    stalls = Stalls()
    stalls.read("w 100.40 12.5\nw 101.70 40.0\ns 101.00 30.0\ns 102.00 250.0\ns 103.00 0.0\n")
    recorded = stalls.since(100.0)
    assert recorded["late"] == [(0.4, 12.5), (1.7, 40.0)]
    # Second 0's requests, served by 1.2 s: the 12.5 ms wake-up, not the later one; the steal
    # of the probe's seconds that overlap [0, 1.2): those ending at 1 and at 2.
    assert in_window(recorded, 0.0, 1.2) == (12.5, 250.0)
    # Second 2: no late wake-up; the probe's second that ended at 3 took nothing.
    assert in_window(recorded, 2.0, 2.5) == (0.0, 0.0)
    # The requests sent in second 0 under a 200 ms SLA are answered by 1.2 s.
    assert in_second_sent(recorded, 0, 200.0) == in_window(recorded, 0.0, 1.2)
    assert in_second_sent(recorded, 1, 100.0) == (40.0, 250.0)


def test_the_probe_runs_beside_the_block_and_reports_every_second():
    with probing() as stalls:
        started = time.perf_counter()
        time.sleep(4.2)
    times = [t for t, ms in stalls.since(started)["steal"] if ms >= 0]
    # A reading a second, on the same clock as this process (another process's perf_counter):
    # the first within the probe's start-up and a second of the block's start.
    assert len(times) >= 2
    assert 0.5 < times[0] < 2.5
    assert all(0.5 < later - earlier < 1.5 for earlier, later in itertools.pairwise(times))
