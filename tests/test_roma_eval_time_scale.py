"""benchmarks/roma_cpu.py and roma_eval.py on a slower or faster machine: the experiment runs
slower or faster as a whole, so each model's demand in cores and its SLA in service times are as
designed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from roma_cpu import REFERENCE_CPU_MS, STAND_INS, load_tests, machine_time_scale, time_scaled  # noqa: E402
from roma_eval import RATE_SCALE, gpu_profile, scaled_tests  # noqa: E402


def test_the_time_scale_is_the_stand_ins_cpu_time_here_over_the_reference():
    assert machine_time_scale(REFERENCE_CPU_MS) == pytest.approx(1.0)
    assert machine_time_scale({m: 1.8 * ms for m, ms in REFERENCE_CPU_MS.items()}) == pytest.approx(1.8)


@pytest.mark.parametrize("time_scale", [0.7, 1.8])
def test_a_scaled_run_asks_for_the_same_cores_and_gives_the_same_slas_in_service_times(time_scale):
    paper = load_tests()
    here = scaled_tests(paper, time_scale)
    slower = {m: time_scale * ms for m, ms in REFERENCE_CPU_MS.items()}
    for test, apps in paper.items():
        for designed, run in zip(apps, here[test], strict=True):
            model = STAND_INS[designed["app"]]
            # Cores of CPU time asked at each step: as at RATE_SCALE on the reference machine.
            assert [r * slower[model] for r in run["rates"]] == pytest.approx(
                [r * RATE_SCALE * REFERENCE_CPU_MS[model] for r in designed["rates"]]
            )
            # The SLA in requests' CPU times: as on the reference machine.
            assert run["sla_ms"] / slower[model] == pytest.approx(designed["sla_ms"] / REFERENCE_CPU_MS[model])
    # The emulated GPU slows with the CPU: its overload at each test's peak step is unchanged.
    reference = gpu_profile(scaled_tests(paper, 1.0), dict(REFERENCE_CPU_MS))
    scaled = gpu_profile(here, slower)
    assert scaled["peak_gpu_load"] == pytest.approx(reference["peak_gpu_load"])
    assert scaled["gpu_ms"]["upconv_xl"] == pytest.approx(time_scale * reference["gpu_ms"]["upconv_xl"])


def test_the_cpu_experiment_keeps_the_papers_rates_on_the_reference_machine_and_scales_them_elsewhere():
    paper = load_tests()
    assert time_scaled(paper, 1.0) == paper
    slower = time_scaled(paper, 2.0)["allapps"][0]
    assert slower["sla_ms"] == 2 * paper["allapps"][0]["sla_ms"]
    assert slower["rates"] == [rate / 2 for rate in paper["allapps"][0]["rates"]]


@pytest.mark.parametrize("scenario", ["step", "step4x", "sla-change"])
def test_the_step_runs_scale_their_slas_and_rates_and_keep_their_seconds(scenario):
    from roma_step import workload

    designed, change_s = workload(scenario, 20.0)
    slower, slower_change_s = workload(scenario, 20.0, 1.6)
    assert slower_change_s == change_s
    for app, run in zip(designed, slower, strict=True):
        assert run["sla_ms"] == pytest.approx(1.6 * app["sla_ms"])
        assert run["rates"] == pytest.approx([rate / 1.6 for rate in app["rates"]])
        assert run["durations"] == app["durations"]
