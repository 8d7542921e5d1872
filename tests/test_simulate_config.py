"""`gateway simulate --config` builds the dispatch core that `gateway serve` builds from the same
config (gateway/dispatch_setup.py): the GPU policy's weights, GPU memory and load times, each
model's batch limit, and CPU profiles read as the gateway measures them, at the executor's cores.

Each test here was a case where the simulator decided otherwise than serving: it batched a model
with no batch dimension, served as if every GPU held every model, ran ROMA with its default
weights, and divided a CPU profile measured at 0.25 core by 0.25 again.
"""

from __future__ import annotations

from pathlib import Path

from gateway.config import load_config
from gateway.dispatch_setup import dispatch_core_of, gpu_scheduler_of
from gateway.tools.simulate import simulate_config
from tests.helpers import fixed_shape_model


def gpu_config(
    folder: Path, models: dict[str, str], profile_rows: str, gpu_extra: str = "", extra: str = "", drop_late: bool = True
) -> Path:
    (folder / "gpu.csv").write_text(profile_rows)
    tables = "".join(
        f'[models.{name}]\npath = "{path}"\nsla_ms = {sla}\nmax_batch_size = 8\ndrop_late = {str(drop_late).lower()}\n'
        "cpu_executor = false\n"
        for name, (path, sla) in models.items()
    )
    path = folder / "config.toml"
    path.write_text(
        f'[node]\ncpu_cores = 1\ngpus = [0]\n[gpu]\nexecutor = "emulated"\nprofile = "gpu.csv"\n{gpu_extra}\n'
        f'[control]\npolicy = "fixed"\n{extra}\n{tables}'
    )
    return path


def test_a_model_without_a_batch_dimension_is_simulated_one_request_at_a_time(tmp_path):
    fixed_shape_model(tmp_path / "fixed.onnx")
    config = gpu_config(tmp_path, {"fixed": ("fixed.onnx", 100)}, "model,alpha_ms,beta_ms\nfixed,1.0,10.0\n")
    arrivals = [(i / 200, "fixed") for i in range(200)]
    result = simulate_config(config, arrivals, cpu_profiles={})
    # Serve runs it one request at a time (its /config says max_batch_size 0): 11 ms a request
    # at 200 requests/s is over the GPU, and most requests miss. Batched, all 200 were in SLO.
    assert result["batch_p90"] == 1.0 and result["batch_mean"] == 1.0
    assert result["models"]["fixed"]["in_slo"] < 100


def test_gpu_memory_and_load_times_are_simulated(tmp_path, tmp_models):
    # One GPU with room for one model; loading either takes 100 ms, over its 50 ms SLA: serve
    # refuses every drop_late request at once (the load makes it hopeless) and loads nothing.
    config = gpu_config(
        tmp_path,
        {"a": ("mlp.onnx", 50), "b": ("mlp.onnx", 50)},
        "model,alpha_ms,beta_ms,memory_mb,load_ms\na,1.0,5.0,600,100\nb,1.0,5.0,600,100\n",
        gpu_extra="memory_mb = 1000",
    )
    arrivals = [(round(0.2 * i + 0.01 * j, 4), "ab"[i % 2]) for i in range(10) for j in range(5)]
    result = simulate_config(config, arrivals, cpu_profiles={})
    for counts in result["models"].values():
        assert counts["arrived"] == counts["refused_deadline"] == 25, counts
    # With room for both and requests that wait (drop_late off), each loads once (100 ms, over
    # the 80 ms SLA), and the GPU holds both from then on. Of the first burst (0, 10, ... 40 ms),
    # the first ends at 100 + l(1) = 106 ms and the other four at 106 + l(4) = 115 ms: all but
    # the last (due at 120 ms) late. Without the loads, all 25 were in SLO.
    roomy = gpu_config(
        tmp_path,
        {"a": ("mlp.onnx", 80), "b": ("mlp.onnx", 80)},
        "model,alpha_ms,beta_ms,memory_mb,load_ms\na,1.0,5.0,400,100\nb,1.0,5.0,400,100\n",
        gpu_extra="memory_mb = 1000",
        drop_late=False,
    )
    result = simulate_config(roomy, arrivals, cpu_profiles={})
    for counts in result["models"].values():
        assert counts["late"] == 4 and counts["in_slo"] == 21, counts


def test_roma_is_simulated_with_the_configs_set_point_and_queue_weight(tmp_path, tmp_models):
    rows = "model,alpha_ms,beta_ms\na,1.0,8.0\nb,3.0,4.0\nc,0.5,15.0\n"
    models = {"a": ("mlp.onnx", 30), "b": ("mlp.onnx", 60), "c": ("mlp.onnx", 100)}
    arrivals = sorted((i / 500, name) for i in range(1000) for name in "abc")
    outcomes = {}
    for weight in (0.0, 1.0):
        config = gpu_config(
            tmp_path, models, rows, gpu_extra=f'policy = "roma"\nqueue_weight = {weight}', extra="setpoint_ratio = 0.5"
        )
        core = dispatch_core_of(load_config(config), gpu_scheduler_of(load_config(config)))
        assert core.gpu_scheduler.queue_weight == weight and core.gpu_scheduler.setpoint_ratio == 0.5
        result = simulate_config(config, arrivals, cpu_profiles={})
        outcomes[weight] = {name: counts.get("in_slo", 0) for name, counts in result["models"].items()}
    # The weight of the queue in ROMA's deficit changes which model gets the GPU (it was
    # ignored: both runs were the default weight's, to the request).
    assert outcomes[0.0] != outcomes[1.0], outcomes


def test_a_cpu_profile_is_read_at_the_executors_configured_cores(tmp_path, tmp_models):
    config = tmp_path / "config.toml"
    config.write_text(
        '[node]\ncpu_cores = 1\n[control]\npolicy = "fixed"\n'
        '[models.mlp]\npath = "mlp.onnx"\nsla_ms = 20\nmax_batch_size = 8\ndrop_late = true\n'
        "cpu = { cores = 0.25, min_cores = 0.1 }\n"
    )
    # Measured at its 0.25 core (GET /admin/models/mlp): 2 ms a row and 5 ms a batch, 7 ms for
    # one request. Divided by 0.25 again it was 28 ms, over the SLA: every request was refused.
    arrivals = [(i / 20, "mlp") for i in range(40)]
    result = simulate_config(config, arrivals, cpu_profiles={"mlp": (2.0, 5.0)})
    assert result["models"]["mlp"]["in_slo"] == 40, result["models"]
