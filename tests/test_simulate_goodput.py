"""Symphony's goodput measured by `gateway simulate`: the bisection, the per-model verdict, the
early stop of a failing run, the upper bound, Clockwork's late action and the --goodput command.

Small zoos built here, a few GPUs, a second or two of virtual time: each test runs in seconds.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.tools.goodput import NoEdgeFound, bisect_load, markdown, measure, meets_slo, upper_bound_rps, zoo_arrivals
from gateway.tools.simulate import SimModel, Simulation, ZooModel, even_split, load_zoo, simulate, simulate_config
from schedulers.gpu import BASELINES, DEFAULT_POLICY
from tests.helpers import ROOT

# Two models that a GPU serves at about 540 requests/s (upper_bound_rps), with batches of 10-15.
TINY = [ZooModel("small", 1.0, 5.0, 20.0), ZooModel("large", 2.0, 4.0, 25.0)]
SHARED_DATA = ROOT.parent / "shared" / "data"


def ended(counts: dict[str, int]) -> int:
    return sum(n for outcome, n in counts.items() if outcome not in ("arrived", "served_on", "bad_rate"))


# -- bisection --------------------------------------------------------------------------------
def test_bisection_finds_a_known_edge_widening_the_bracket_either_way():
    edge = 123.4
    probes = []

    def passes(load: float) -> bool:
        probes.append(load)
        return load <= edge

    # The edge above the bracket: high doubles until it fails.
    found = bisect_load(passes, 10.0, 50.0, 0.5)
    assert edge - 0.5 <= found <= edge
    assert max(probes) >= edge and len(probes) < 20
    # The edge under the bracket: low halves until it passes.
    found = bisect_load(lambda load: load <= 3.0, 10.0, 50.0, 0.1)
    assert 2.9 <= found <= 3.0
    # Nothing passes above the tolerance: the answer is 0.
    assert bisect_load(lambda load: load <= 0.01, 10.0, 50.0, 0.5) == 0.0
    with pytest.raises(ValueError):
        bisect_load(passes, 50.0, 10.0, 0.5)


# -- the verdict ------------------------------------------------------------------------------
def test_meets_slo_judges_every_model_not_the_whole():
    # 2 bad of 400 overall (0.5%), but one model has 2% bad: the run fails.
    result = {"models": {"a": {"arrived": 100, "in_slo": 98, "late": 2}, "b": {"arrived": 300, "in_slo": 300}}}
    assert not meets_slo(result)
    # 1% exactly is within the limit (p99 within the SLO); a model with no arrivals passes.
    result = {"models": {"a": {"arrived": 300, "in_slo": 297, "refused_deadline": 3}, "idle": {}}}
    assert meets_slo(result)
    assert not meets_slo(result, bad_limit=0.005)


# -- early termination ------------------------------------------------------------------------
def test_a_failing_run_stops_early_and_says_so():
    result = simulate(TINY, 1, 3000.0, 1.0, DEFAULT_POLICY, 2.0, seed=1, stop_above_bad_rate=0.01)
    assert result["stopped_early"] and result["stopped_at_s"] < 1.0
    assert not meets_slo(result)
    for counts in result["models"].values():
        assert counts["arrived"] == ended(counts)  # what had not ended is counted "unfinished"
    assert sum(counts.get("unfinished", 0) for counts in result["models"].values()) > 0
    full = simulate(TINY, 1, 3000.0, 1.0, DEFAULT_POLICY, 2.0, seed=1)
    assert not full["stopped_early"] and full["stopped_at_s"] is None
    assert "unfinished" not in str(full["models"])


def test_early_termination_leaves_a_passing_run_unchanged():
    with_stop = simulate(TINY, 2, 200.0, 1.0, DEFAULT_POLICY, 2.0, seed=3, stop_above_bad_rate=0.01)
    without = simulate(TINY, 2, 200.0, 1.0, DEFAULT_POLICY, 2.0, seed=3)
    assert meets_slo(without) and not with_stop["stopped_early"]
    assert with_stop["models"] == without["models"]
    assert with_stop["gpu_idle_fraction"] == without["gpu_idle_fraction"]


# -- the bracket ------------------------------------------------------------------------------
def test_upper_bound_matches_the_hand_computation():
    zoo = [ZooModel("a", 1.0, 10.0, 30.0), ZooModel("b", 2.0, 4.0, 20.0)]
    # a: B = 20, 1 + 10/20 = 1.5 GPU-ms a request; b: B = 8, 2 + 4/8 = 2.5. T/2 x 4 ms = 2 GPUs x 1000 ms.
    assert upper_bound_rps(zoo, 2) == pytest.approx(1000.0)
    # Half the SLO: a: B = 5, 1 + 2 = 3; b: B = 3, 2 + 4/3. T = 2 x 2 x 1000 / (3 + 2 + 4/3).
    assert upper_bound_rps(zoo, 2, slo_fraction=0.5) == pytest.approx(4000 / (5 + 4 / 3))
    # A model whose batch of one does not fit its SLO: no load meets every SLO.
    assert upper_bound_rps([*zoo, ZooModel("c", 1.0, 25.0, 20.0)], 2) == 0.0


@pytest.mark.skipif(not (SHARED_DATA / "symphony_zoo_1080ti.csv").exists(), reason="Symphony's zoo data not here")
def test_upper_bound_of_the_1080ti_zoo_is_the_quoted_one():
    zoo = load_zoo(SHARED_DATA / "symphony_zoo_1080ti.csv")
    assert upper_bound_rps(zoo, 64) == pytest.approx(8970, abs=5)
    assert upper_bound_rps(zoo, 64, slo_fraction=0.5) == pytest.approx(6970, abs=5)


# -- arrivals ---------------------------------------------------------------------------------
def test_arrivals_follow_each_models_rate_and_scale_with_the_load():
    arrivals = zoo_arrivals({"a": 300.0, "b": 100.0, "c": 0.0}, 0.5, 10.0, random.Random(7))
    counts = {name: sum(1 for _, m in arrivals if m == name) for name in "abc"}
    assert 2700 < counts["a"] < 3300 and 800 < counts["b"] < 1200 and counts["c"] == 0
    assert arrivals == sorted(arrivals)
    # The same seed at twice the load: the same gaps, halved (a bisection compares like with like).
    single = [t for t, m in zoo_arrivals(even_split(TINY, 100.0), 0.5, 10.0, random.Random(7)) if m == "small"]
    double = [t for t, m in zoo_arrivals(even_split(TINY, 200.0), 0.5, 10.0, random.Random(7)) if m == "small"]
    assert double[: len(single) // 2] == pytest.approx([t / 2 for t in single[: len(single) // 2]])


# -- Clockwork's late action ------------------------------------------------------------------
def late_run(dispatch_ms: float) -> tuple[Simulation, dict, list[int]]:
    models = [SimModel(m.name, m.slo_ms, gpu=(m.per_item_ms, m.fixed_ms)) for m in TINY]
    simulation = Simulation(models, gpus=2, policy=DEFAULT_POLICY, seed=5, gpu_dispatch_ms=dispatch_ms)
    refused_late: list[int] = []
    on_batch_late = simulation.core.on_batch_late

    def spy(batch, now):
        assert now > batch.latest_start
        refused_late.extend(r.id for r in batch.requests)
        return on_batch_late(batch, now)

    simulation.core.on_batch_late = spy
    arrivals = zoo_arrivals(even_split(TINY, 700.0), 1.0, 2.0, random.Random(5))
    return simulation, simulation.run(arrivals, 2.0), refused_late


def test_a_batch_received_after_its_latest_start_is_refused_and_its_requests_go_back():
    simulation, result, refused_late = late_run(dispatch_ms=4.0)
    assert result["late_actions"] > 0 and refused_late
    # Its requests were put back: some were served later, and every request ended once.
    assert any(request_id in simulation.device_of for request_id in refused_late)
    for counts in result["models"].values():
        assert counts["arrived"] == ended(counts)
    # Without the delay the executor receives every batch in time.
    _, result, refused_late = late_run(dispatch_ms=0.0)
    assert result["late_actions"] == 0 and not refused_late
    for counts in result["models"].values():
        assert counts["arrived"] == ended(counts)


# -- the command ------------------------------------------------------------------------------
def test_simulate_goodput_writes_per_model_counts(tmp_path: Path):
    zoo = tmp_path / "tiny.csv"
    zoo.write_text(
        "model,alpha_ms,beta_ms,slo_ms\n" + "".join(f"{m.name},{m.per_item_ms},{m.fixed_ms},{m.slo_ms}\n" for m in TINY)
    )
    output = tmp_path / "goodput.json"
    command = [
        sys.executable, "-m", "gateway.cli", "simulate", "--zoo", str(zoo), "--goodput", "--gpus", "2",
        "--policies", DEFAULT_POLICY, "--shapes", "1.0", "--seeds", "2", "--duration", "1", "--jobs", "2",
        "--output", str(output),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads(output.read_text())
    entry = report["zoos"]["tiny"]["shapes"]["1"][DEFAULT_POLICY]
    goodput = entry["goodput"]
    assert set(goodput["per_seed"]) == {"0", "1"} and 0 < goodput["min"] <= goodput["mean"] <= 1.2 * 1083
    for point in entry["points"].values():
        for run in point["runs"].values():
            for counts in run["models"].values():
                assert counts["arrived"] > 0 and counts["arrived"] == ended(counts)
                assert {"in_slo", "bad_rate"} <= set(counts)
    assert set(entry["points"]) == {"0.25", "0.5", "0.75", "1", "1.25", "1.5", "2"}
    assert "goodput" in done.stdout and "small" in done.stdout  # the tables, and the worst models by name
    helped = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "simulate", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert "--goodput" in helped.stdout and "--dispatch-delay-ms" in helped.stdout


def test_a_zoo_whose_slos_outlast_the_run_is_refused_not_widened_for_ever(tmp_path: Path):
    # An SLO of 1000 s is never missed in a run of 0.2 s, whatever the load: the bisection once
    # doubled the load 30 times (billions of requests a run) looking for an edge.
    zoo = tmp_path / "patient.csv"
    zoo.write_text("model,alpha_ms,beta_ms,slo_ms\npatient,1,1,1000000\nslow,2,1,900000\n")
    command = [
        sys.executable, "-m", "gateway.cli", "simulate", "--zoo", str(zoo), "--goodput", "--gpus", "1",
        "--policies", DEFAULT_POLICY, "--shapes", "poisson", "--seeds", "2", "--duration", "0.2", "--jobs", "2",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "4x the zoo's upper bound" in done.stderr and "SLOs of up to 1e+06 ms" in done.stderr
    with pytest.raises(NoEdgeFound):
        bisect_load(lambda load: True, 1.0, 2.0, 0.1, max_widenings=2)
    # A tiny alpha against a long SLO: the bound overflowed floor() (a traceback), and is 1e303
    # requests/s, which no run can offer.
    zoo.write_text("model,alpha_ms,beta_ms,slo_ms\ntiny,1e-300,0,1e300\n")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "requests a run of 0.2 s, over the 20,000,000 a run" in done.stderr


def test_the_report_of_baselines_alone_has_no_empty_summary():
    # --policies edf: the summary of the default against the baselines was a header and no row.
    report = measure({"tiny": TINY}, gpus=2, shapes=[None], policies=["edf"], seeds=[0], duration_s=0.5)
    text = markdown(report, DEFAULT_POLICY, BASELINES)
    assert "best baseline" not in text and "## tiny" in text
    assert "best baseline" in markdown(
        measure({"tiny": TINY}, gpus=2, shapes=[None], policies=[DEFAULT_POLICY, "edf"], seeds=[0], duration_s=0.5),
        DEFAULT_POLICY,
        BASELINES,
    )


def test_a_config_whose_arrivals_all_come_at_once_still_reports(tmp_models: Path):
    """Every arrival at 0 spans no time: the rates are over the run, to its last request's end
    (they divided by the span, 0)."""
    (tmp_models / "gpu.csv").write_text("model,alpha_ms,beta_ms\nmlp,0.5,5\n")
    (tmp_models / "config.toml").write_text(
        '[node]\ncpu_cores = 2\ngpus = [0]\n[gpu]\nexecutor = "emulated"\nprofile = "gpu.csv"\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 20\ncpu = { cores = 0.5, threads = 1 }\n'
    )
    result = simulate_config(tmp_models / "config.toml", [(0.0, "mlp")] * 4, cpu_profiles={"mlp": (0.5, 1.0)})
    served = result["models"]["mlp"]["in_slo"]
    assert result["requests"] == 4 and served > 0
    # Each request at most its 20 ms SLA: the run ended by then, so the rate is at least 4 / 20 ms.
    assert served / 0.02 <= result["goodput_rps"] < float("inf")
    assert result["goodput_by_model_rps"]["mlp"] == result["goodput_rps"]
    assert 0 <= result["gpu_idle_fraction"] < 1
