"""``gateway plan``: for each model step of a pipeline, the device, cores, instances and batch size
that serve a request rate within every path's SLA at the least cost (planner/: FA2's dynamic
program over Harpagon's configurations, or either paper alone, or an even split of the SLA), from
the latency profiles a running gateway measured; ``--apply`` writes the plan into the config,
``--apply-to URL`` sets it on a running gateway through its admin API.

Profiles: each model step's l(b) on one core, measured here with ONNX Runtime (one intra-op
thread) on the inputs the step really gets: the pipeline is run by hand on ``--sample`` (an image
file for a pipeline that takes one RGB image, or a .npz of its inputs), and each model is timed at
batch sizes 1, 2, 4, ... up to its max_batch_size (the step's rows repeated); the rows a step
gets per request of the pipeline (the sample's: text lines per image, say) scale its rate. A CPU instance of c
cores is read as 1/c of that time (a quota below one core stretches the run, threads above one
share it), and the points are fitted with FA2's quadratic. Or ``--profiles URL``: the l(b) points
a running gateway measured (``GET /admin/models/{m}``, ``profiles.cpu.measured_ms``) at its
executors' cores, where those were held fixed.
The function steps between models cost no executor: what they take on the sample (each timed
there; or ``--functions-ms`` on every path) is kept out of each path's SLA before the models share
it, and the cores they take in the gateway's process at the rate are printed beside the plan.

Arrivals: ours and the even split plan each step's latency at the 99th percentile of Poisson
arrivals (planner/queueing.py: the batch's collection and its wait for an instance, which the
papers' worst case leaves out); ``--arrivals even`` gives them the papers' model, which FA2 and
Harpagon alone always use.

What ``--apply`` writes for a step's model: ``sla_ms`` its latency budget (the step's worst case
in the plan: the model's queue and schedulers then hold that step to it), ``max_batch_size`` at
least the planned batch, ``dispatch_batch`` the planned batch (Harpagon's batch-aware dispatch),
and ``cpu.cores`` instances x cores (one executor per model on a node: its cores are the sum;
``replicas`` on a cluster), so that the file still loads: at least the model's ``cpu.min_cores``
(more cores never lengthen a step), an existing ``cpu.max_cores`` raised to them where below, and
a model planned more than ``node.cpu_cores`` refused before anything is written.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from executors.tensors import KSERVE_TO_NUMPY, holds_datatype
from gateway.config import GatewayConfig
from gateway.pipeline.graph import PipelineGraph
from gateway.tools.arguments import existing_file, non_negative_float, positive_float, positive_floats

POLICIES = ("ours", "fa2", "harpagon", "even")
DEFAULT_CORES = (0.5, 1.0, 2.0)
# Cores summed from instances come out as 2.0000000000000004; this much is taken for rounding.
ROUNDING = 1e-9


@dataclass(frozen=True)
class MeasuredModel:
    """A model's measured l(b) points (batch size -> ms) and the cores its CPU executor had."""

    cores: float
    cpu_ms: dict[int, float]
    gpu_ms: dict[int, float]
    rows: float = 1.0  # rows the model gets per request of the pipeline (text lines per image, say)


@dataclass(frozen=True)
class Measured:
    """What the planner is given: each model's profile, and each function step's ms per request
    (measured on the sample; empty from ``--profiles``)."""

    models: dict[str, MeasuredModel]
    functions_ms: dict[str, float]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config")
    parser.add_argument("--rate", type=positive_float, required=True, help="the pipeline's requests per second")
    parser.add_argument("--pipeline", help="which [pipelines.NAME] (default: the only one)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--sample",
        type=existing_file,
        help="an input of the pipeline to measure its steps on: an image file, or a .npz of its inputs",
    )
    where.add_argument("--profiles", help="or: a running gateway that has served the pipeline, http://HOST:PORT")
    parser.add_argument("--token", help="its admin token")
    parser.add_argument("--policy", choices=POLICIES, default="ours")
    parser.add_argument("--cores", type=positive_floats, default=list(DEFAULT_CORES), help="core counts a CPU instance may have")
    parser.add_argument("--gpu-price", type=non_negative_float, default=8.0, help="a GPU's cost in cores")
    parser.add_argument(
        "--functions-ms",
        type=non_negative_float,
        help="time the function steps take on a path (default: as measured on --sample, else 0)",
    )
    parser.add_argument(
        "--arrivals",
        choices=("poisson", "even"),
        default="poisson",
        help="ours and even: plan a percentile of the queues under Poisson arrivals (default), or the "
        "papers' worst case of evenly spaced ones; fa2 and harpagon always use the papers' model",
    )
    parser.add_argument("--apply", action="store_true", help="write the plan into the config file")
    parser.add_argument(
        "--apply-to",
        metavar="URL",
        help="set the plan on a running gateway through its admin API (each model's SLA, cores and dispatch_batch)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def fetch_profiles(url: str, models: list[str], token: str | None) -> dict[str, MeasuredModel]:
    measured = {}
    for model in models:
        described = _admin(url, "GET", f"/admin/models/{model}", token)
        profiles = described.get("profiles", {})
        cpu_executors = [e for e in described.get("executors", []) if e.get("device") == "cpu"]
        measured[model] = MeasuredModel(
            cores=float(cpu_executors[0]["cores"]) if cpu_executors else 1.0,
            cpu_ms={int(b): float(ms) for b, ms in profiles.get("cpu", {}).get("measured_ms", {}).items()},
            gpu_ms={int(b): float(ms) for b, ms in profiles.get("gpu", {}).get("measured_ms", {}).items()},
        )
    return measured


def sample_inputs(path: str, graph: PipelineGraph) -> dict[str, np.ndarray]:
    """The pipeline's inputs from ``path``: a .npz of them, or an image for a pipeline of one image input.
    A sample the served pipeline would refuse (an input missing or unknown, of another datatype or
    shape) is refused here with one line, before anything runs on it."""
    inputs = _read_npz(path) if path.endswith(".npz") else _read_image(path, graph)
    problem = sample_problem(inputs, graph)
    if problem is not None:
        raise SystemExit(f"gateway plan: --sample {path}: {problem}")
    return inputs


def _read_npz(path: str) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(path)  # pickles refused: a sample is arrays only
    except (OSError, ValueError, EOFError):
        loaded = None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise SystemExit(f"gateway plan: --sample {path}: not a .npz of arrays (numpy.savez's) that numpy can read")
    with loaded:
        try:
            return {k: loaded[k] for k in loaded.files}
        except ValueError:  # an array of Python objects: numpy reads it only by unpickling
            raise SystemExit(f"gateway plan: --sample {path}: holds an array of Python objects; save strings as str") from None


def _read_image(path: str, graph: PipelineGraph) -> dict[str, np.ndarray]:
    specs = graph.table.inputs
    if len(specs) != 1 or specs[0].datatype != "UINT8":
        names = ", ".join(s.name for s in specs)
        raise SystemExit(f"gateway plan: --sample {path}: an image is a sample of one UINT8 input; give a .npz of {names}")
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return {specs[0].name: np.asarray(image.convert("RGB"))}
    except (UnidentifiedImageError, OSError) as error:
        raise SystemExit(f"gateway plan: --sample {path}: not an image (nor a .npz of the inputs): {error}") from None


def sample_problem(inputs: dict[str, np.ndarray], graph: PipelineGraph) -> str | None:
    """What the served pipeline would refuse in ``inputs``, in one line, or None."""
    declared = {spec.name: spec for spec in graph.table.inputs}
    missing, unknown = sorted(declared.keys() - inputs.keys()), sorted(inputs.keys() - declared.keys())
    if missing or unknown:
        return (
            f"it holds {', '.join(map(repr, sorted(inputs))) or 'no array'}, the pipeline's inputs are "
            f"{', '.join(map(repr, declared))}"
        )
    for name, array in inputs.items():
        spec = declared[name]
        if not holds_datatype(array, spec.datatype):
            return f"'{name}' is {array.dtype}, the pipeline declares {spec.datatype}"
        fits = len(array.shape) == len(spec.shape) and all(d in (-1, n) for d, n in zip(spec.shape, array.shape, strict=True))
        if not fits:
            return f"'{name}' has shape {list(array.shape)}, the pipeline declares {list(spec.shape)} (-1: any)"
    return None


def measure_steps(config: GatewayConfig, graph: PipelineGraph, inputs: dict[str, np.ndarray], runs: int = 3) -> Measured:
    """Run the pipeline by hand on ``inputs`` (each function step timed, the median of ``runs``),
    then time each model on its step's real input at batch sizes 1, 2, 4, ... (one intra-op
    thread: one core), the median of ``runs``."""
    import onnxruntime as ort

    from executors.tensors import describe
    from gateway.pipeline.functions import load_function
    from gateway.signature import ModelSignature

    base = config.source.resolve().parent
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    sessions, fed, functions_ms, idle = {}, {}, {}, set()
    tensors = {f"request/{k}": v for k, v in inputs.items()}
    for name in graph.order:
        step = next(s for s in graph.table.steps if s.name == name)
        arrays = {k: tensors[source] for k, source in step.inputs.items()}
        if step.function is not None:
            function = load_function(step.function, base)
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                outputs = function(arrays)
                times.append((time.perf_counter() - started) * 1000)
            functions_ms[name] = sorted(times)[len(times) // 2]
        else:
            session = sessions.setdefault(step.model, ort.InferenceSession(str(config.models[step.model].path), options))
            arrays = {i.name: arrays[i.name] for i in session.get_inputs()}
            signature = ModelSignature.from_json(describe(session))
            if signature.batchable and next(iter(arrays.values())).shape[0] == 0:
                # No rows (no text found, say): the served pipeline skips the model and gives its
                # empty outputs (gateway/pipeline/runner.py), so the step takes no time here either.
                idle.add(step.model)
                outputs = {t.name: np.zeros((0, *(max(d, 0) for d in t.shape[1:])), KSERVE_TO_NUMPY[t.datatype])
                           for t in signature.outputs}  # fmt: skip
            else:
                fed[step.model] = arrays
                outputs = dict(zip((o.name for o in session.get_outputs()), session.run(None, arrays), strict=True))
        tensors.update({f"{name}/{k}": v for k, v in outputs.items()})
    measured = {}
    for model, arrays in fed.items():
        session, rows = sessions[model], max(1, next(iter(arrays.values())).shape[0])
        points = {}
        batch = 1
        while batch <= config.models[model].max_batch_size:
            repeated = {k: np.concatenate([v] * math.ceil(batch / rows))[:batch] if v.shape[0] else v for k, v in arrays.items()}
            session.run(None, repeated)  # warm-up: the first run of a shape sets up its kernels
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                session.run(None, repeated)
                times.append((time.perf_counter() - started) * 1000)
            points[batch] = sorted(times)[len(times) // 2]
            batch *= 2
        rows_fed = next(iter(arrays.values())).shape[0]
        measured[model] = MeasuredModel(cores=1.0, cpu_ms=points, gpu_ms={}, rows=float(rows_fed))
    for model in idle - fed.keys():
        measured[model] = MeasuredModel(cores=1.0, cpu_ms={}, gpu_ms={}, rows=0.0)  # skipped: no rows, no time
    return Measured(measured, functions_ms)


def model_steps(
    graph: PipelineGraph, functions_ms: dict[str, float] | None = None, unreached: frozenset[str] = frozenset()
) -> tuple[dict[str, str], list[tuple[str, str]], list[tuple[tuple[str, ...], float]]]:
    """The steps that run models (step -> model), the edges between them through function steps,
    and the paths (model steps only) with their SLAs in ms: each less the function steps'
    ``functions_ms`` on the pipeline's paths that run its models (the most of those). The steps
    of ``unreached`` models (no rows on the sample) are passed through as steps of no time."""
    steps = {s.name: s.model for s in graph.table.steps if s.model is not None and s.model not in unreached}

    def model_ancestors(step: str) -> set[str]:
        found: set[str] = set()
        for parent in graph.needs[step]:
            found |= {parent} if parent in steps else model_ancestors(parent)
        return found

    edges = sorted({(a, s) for s in steps for a in model_ancestors(s)})
    # The paths of the models' own DAG, entry to exit (FA2's paths): each with the tightest SLA
    # of the pipeline's paths that run exactly its models, else the pipeline's.
    given: dict[tuple[str, ...], float] = {}
    for path, sla_ms in graph.paths():
        only = tuple(s for s in path if s in steps)
        left = sla_ms - sum((functions_ms or {}).get(s, 0.0) for s in path)
        given[only] = min(left, given.get(only, math.inf))
    children = {s: [b for a, b in edges if a == s] for s in steps}
    entries = [s for s in steps if not any(b == s for _, b in edges)]
    paths: dict[tuple[str, ...], float] = {}

    def walk(path: tuple[str, ...]) -> None:
        if not children[path[-1]]:
            paths[path] = given.get(path, graph.table.sla_ms)
        for nxt in children[path[-1]]:
            walk((*path, nxt))

    for entry in entries:
        walk((entry,))
    return steps, edges, list(paths.items())


def build_pipeline(graph, measured, rate, cores, gpu_price, functions_ms, max_batch, arrivals="even"):  # noqa: ANN001
    """The planner's input (planner.pipeline.Pipeline) for the pipeline's model steps:
    ``functions_ms`` the function steps' ms (step -> ms), or a number for every path."""
    from planner.latency_model import LatencyModel
    from planner.pipeline import Device, Path, Pipeline, Step

    per_step = functions_ms if isinstance(functions_ms, dict) else None
    flat_ms = 0.0 if per_step is not None else float(functions_ms)
    # A model the sample gave no rows is skipped as the served pipeline skips it: nothing to plan.
    unreached = frozenset(m for m, profile in measured.items() if profile.rows == 0)
    steps, edges, paths = model_steps(graph, per_step, unreached)
    planned = []
    for step, model in steps.items():
        profile = measured[model]
        # A request's rows at a step (text lines of an image) are not split: they reach the model
        # together and wait for one another. So the step is planned in requests: a batch of k
        # requests is k r rows, d(k) = d_rows(k r), at the pipeline's rate (times the share of
        # requests that reach it where a request brings under one row on average).
        per_request = max(1.0, profile.rows)
        sizes = tuple(k for k in (1, 2, 4, 8, 16, 32) if k == 1 or math.ceil(k * per_request) <= max_batch[model])

        def in_requests(rows_model: LatencyModel, scale: float = 1.0, r: float = per_request) -> LatencyModel:
            quadratic, per_item = rows_model.quadratic_s * r * r, rows_model.per_item_s * r
            return LatencyModel(quadratic * scale, per_item * scale, rows_model.fixed_s * scale)

        devices = []
        if profile.cpu_ms:
            base = LatencyModel.fit([(b, ms / 1000) for b, ms in profile.cpu_ms.items()])
            for c in cores:
                # cores past the measured ones make it that much faster
                devices.append(Device(f"cpu:{c:g}", c, in_requests(base, profile.cores / c), sizes))
        if profile.gpu_ms:
            gpu = LatencyModel.fit([(b, ms / 1000) for b, ms in profile.gpu_ms.items()])
            devices.append(Device("gpu", gpu_price, in_requests(gpu), sizes))
        if not devices:
            raise SystemExit(f"gateway plan: model '{model}' has no measured profile yet: serve the pipeline first")
        planned.append(Step(step, tuple(devices), rate_share=profile.rows / per_request))
    planned_paths = tuple(Path(p, (sla - flat_ms) / 1000) for p, sla in paths)
    return Pipeline(tuple(planned), tuple(edges), planned_paths, rate, arrivals), steps


def batch_rows(batch_requests: int, rows: float) -> int:
    """The rows of a planned batch of requests that bring ``rows`` each (the config's batch sizes count rows)."""
    return max(1, math.ceil(batch_requests * max(1.0, rows) - 1e-9))


@dataclass(frozen=True)
class StepPlan:
    """What the gateway does with a step's plan: its device, batch, instances, worst case and cost."""

    device: str
    batch: int
    instances: int
    latency_s: float
    cost: float


def run_planner(policy: str, pipeline: Any) -> dict[str, StepPlan]:
    """step -> its plan, from planner/: ours (FA2's program over the batch-aware worst case),
    FA2 alone, Harpagon alone (a module's multi-tuple set served as one executor: its majority
    configuration's device and batch, its machines paid whole), or an even split of each path's SLA."""
    from planner.dag_program import fa2_plan
    from planner.latency_split import harpagon_plan
    from planner.plan import even_split_plan, plan_pipeline

    if policy == "harpagon":
        result = harpagon_plan(pipeline)
        if result is None:
            raise SystemExit("gateway plan: no configuration meets every path's SLA at this rate")
        plans = {}
        for step, config_set in result.modules.items():
            majority = max(config_set.allocations, key=lambda a: a.machines).configuration
            plans[step] = StepPlan(
                majority.hardware,
                majority.batch,
                max(1, round(config_set.whole_machine_cost / majority.price)),
                config_set.worst_case_latency_s,
                config_set.whole_machine_cost,
            )
        return plans
    chosen = {"ours": plan_pipeline, "fa2": fa2_plan, "even": even_split_plan}[policy](pipeline)
    if chosen is None or not chosen.feasible:
        raise SystemExit("gateway plan: no configuration meets every path's SLA at this rate")
    return {s: StepPlan(c.device, c.batch, c.instances, c.latency_s, c.cost) for s, c in chosen.choices.items()}


def planned_cores(steps: dict[str, str], choices: dict[str, Any]) -> dict[str, float]:
    """Each model's cores in the plan, instances x cores, for the models planned on CPU instances:
    a model that several steps run gets the cores of each (the plan prices them apart; the last
    step's alone were written)."""
    cores: dict[str, float] = {}
    for step, model in steps.items():
        if choices[step].device.startswith("cpu:"):
            cores[model] = cores.get(model, 0.0) + float(choices[step].device.split(":", 1)[1]) * choices[step].instances
    return cores


def planned_models(steps: dict[str, str], choices: dict[str, Any]) -> dict[str, tuple[float, int]]:
    """Each model's SLA and batch in the plan: its step's latency (to 0.1 ms, rounded up, so never
    0 and never under what the plan allows it) and batch; for a model that several steps run, the
    tightest step's latency and the smallest batch, which every one of its steps fits."""
    planned: dict[str, tuple[float, int]] = {}
    for step, model in steps.items():
        choice = choices[step]
        sla_ms = math.ceil(round(choice.latency_s * 1000 * 10, 6)) / 10 or 0.1
        if model in planned:
            sla_ms, batch = min(sla_ms, planned[model][0]), min(choice.batch, planned[model][1])
        else:
            batch = choice.batch
        planned[model] = (sla_ms, batch)
    return planned


def over_the_node(cores: dict[str, float], node_cores: float) -> str | None:
    """Why the plan's cores cannot be given on a node of ``node_cores`` cores (the first model
    planned more than the node has: the loader and the admin API refuse it), or None."""
    for model, wanted in cores.items():
        if wanted > node_cores + ROUNDING:
            return f"model '{model}' is planned {wanted:g} cores, over the node's {node_cores:g} (node.cpu_cores)"
    return None


def apply(config: GatewayConfig, steps: dict[str, str], choices: dict[str, Any]) -> list[str]:
    """Write each step's plan into its model's table, keeping the file's comments and order, so
    that the file still loads: a plan that needs more cores than the node has is refused before
    anything is written, and cores under a model's min_cores are raised to it. Returns a line for
    each such change of the plan."""
    import tomlkit

    cores_of = planned_cores(steps, choices)
    gpu_only = [m for m in cores_of if config.models[m].cpu is None]
    problem = (
        f"model '{gpu_only[0]}' has no CPU executor (cpu_executor = false) and the plan puts it on CPU instances"
        if gpu_only
        else over_the_node(cores_of, config.node.cpu_cores)
    )
    if problem is not None:
        raise SystemExit(f"gateway plan: {problem}: nothing written")
    document = tomlkit.parse(config.source.read_text())
    changed = []
    for model, (sla_ms, batch) in planned_models(steps, choices).items():
        table = document["models"][model]
        table["sla_ms"] = sla_ms
        table["max_batch_size"] = max(int(table.get("max_batch_size", 1)), batch)
        table["dispatch_batch"] = batch
        if model in cores_of:
            cpu_config = config.models[model].cpu
            assert cpu_config is not None  # refused above
            cores, floor = cores_of[model], cpu_config.min_cores
            if cores < floor:
                # More cores never lengthen a step: the plan's latencies still hold at the floor.
                changed.append(f"model '{model}': cores {floor:g}, its min_cores, rather than the planned {cores:g}")
                cores = floor
            cpu = table.get("cpu") or tomlkit.inline_table()
            cpu["cores"] = cores
            cpu["threads"] = max(1, math.ceil(cores))
            # The controller's ceiling is the user's: only raised where the plan needs more, never
            # added (absent, it is the node's cores).
            if "max_cores" in cpu and float(cpu["max_cores"]) < cores:
                cpu["max_cores"] = cores
            table["cpu"] = cpu
    config.source.write_text(tomlkit.dumps(document))
    return changed


def _admin(url: str, method: str, path: str, token: str | None, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    try:
        request = urllib.request.Request(f"{url.rstrip('/')}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        raise SystemExit(f"gateway plan: {method} {path} answered {error.code}: {error.read().decode()[:300]}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:  # unreachable; not JSON; a URL without a scheme
        raise SystemExit(f"gateway plan: {method} {url.rstrip('/')}{path}: {getattr(error, 'reason', error)}") from None


def apply_to(url: str, token: str | None, steps: dict[str, str], choices: dict[str, Any]) -> list[str]:
    """Set each step's plan on a running gateway: its model's SLA (the step's budget), pinned cores
    (instances x cores) and dispatch_batch. Every model is checked first (known, a CPU executor,
    max_batch_size, fixed at start, room for the planned batch; the node room for its cores; the SLA
    within what the admin API takes), so a plan is set whole or not at all."""
    from gateway.routes import SLA_MS_RANGE

    wanted = []
    on_gpu = [step for step in steps if not choices[step].device.startswith("cpu:")]
    if on_gpu:
        raise SystemExit(f"gateway plan: step {on_gpu[0]} is planned on a GPU; only CPU plans are set at run time")
    cores_of = planned_cores(steps, choices)
    for model, (sla_ms, batch) in planned_models(steps, choices).items():
        described = _admin(url, "GET", f"/admin/models/{model}", token)
        limit = int(described.get("max_batch_size") or 1)
        if batch > limit:
            raise SystemExit(
                f"gateway plan: model '{model}' takes batches of at most {limit} rows (max_batch_size, fixed at "
                f"start) and the plan wants {batch}: write it with --apply and restart"
            )
        if not SLA_MS_RANGE[0] <= sla_ms <= SLA_MS_RANGE[1]:
            raise SystemExit(
                f"gateway plan: model '{model}' is planned an SLA of {sla_ms:g} ms, outside the admin API's "
                f"{SLA_MS_RANGE[0]:g} to {SLA_MS_RANGE[1]:.0f} ms: nothing set"
            )
        wanted.append((model, sla_ms, cores_of[model], batch))
    # The admin API pins at most the node's cores: a model planned more would be refused midway.
    node_cores = float(_admin(url, "GET", "/admin/node", token)["cpu_cores"])
    problem = over_the_node({model: cores for model, _, cores, _ in wanted}, node_cores)
    if problem is not None:
        raise SystemExit(f"gateway plan: {problem}: nothing set")
    done = []
    for model, sla_ms, cores, batch in wanted:
        _admin(url, "PUT", f"/admin/models/{model}/sla", token, {"sla_ms": sla_ms})
        _admin(url, "PUT", f"/admin/models/{model}/cores", token, {"cores": cores})
        _admin(url, "PUT", f"/admin/models/{model}/dispatch_batch", token, {"dispatch_batch": batch})
        done.append(f"{model}: sla_ms {sla_ms:g}, cores {cores:g}, dispatch_batch {batch}")
    return done


def run(args: argparse.Namespace) -> int:
    from gateway.cli import load_or_report

    config = load_or_report(args.config)
    if config is None:
        return 2
    if not config.pipelines:
        print("gateway plan: the config has no [pipelines.NAME]", file=sys.stderr)
        return 2
    name = args.pipeline or next(iter(config.pipelines))
    if name not in config.pipelines:
        print(f"gateway plan: no pipeline '{name}' (pipelines: {', '.join(config.pipelines)})", file=sys.stderr)
        return 2
    outputs = {m: [] for m in config.models}
    import onnx

    for step in config.pipelines[name].steps:
        if step.model is not None and not outputs[step.model]:
            outputs[step.model] = [
                o.name for o in onnx.load(str(config.models[step.model].path), load_external_data=False).graph.output
            ]
    graph = PipelineGraph.build(name, config.pipelines[name], outputs)
    models = sorted({s.model for s in graph.table.steps if s.model is not None})
    if args.sample is not None:
        measured = measure_steps(config, graph, sample_inputs(str(args.sample), graph))
    else:
        measured = Measured(fetch_profiles(args.profiles, models, args.token), {})
    cores = tuple(args.cores)
    max_batch = {m: config.models[m].max_batch_size for m in models}
    functions = measured.functions_ms if args.functions_ms is None else args.functions_ms
    # The papers' planners keep the papers' model of evenly spaced arrivals.
    arrivals = args.arrivals if args.policy in ("ours", "even") else "even"
    pipeline, steps = build_pipeline(graph, measured.models, args.rate, cores, args.gpu_price, functions, max_batch, arrivals)
    # Model steps the sample gave no rows (no text found, say): skipped, as in serving, so not planned.
    unplanned = [s.name for s in graph.table.steps if s.model is not None and s.name not in steps]
    if not steps:
        raise SystemExit(f"gateway plan: --sample {args.sample} gives no model step a row: nothing to plan from it")
    # The function steps run in the gateway's own process, outside every executor's cores.
    gateway_cores = args.rate * sum(measured.functions_ms.values()) / 1000
    started = time.perf_counter()
    planned = run_planner(args.policy, pipeline)
    took_ms = (time.perf_counter() - started) * 1000
    # Planned in requests, written and shown in rows (what max_batch_size and dispatch_batch count).
    choices = {s: replace(c, batch=batch_rows(c.batch, measured.models[steps[s]].rows)) for s, c in planned.items()}
    rows = [
        {"step": s, "model": steps[s], "device": c.device, "batch": c.batch, "batch_requests": planned[s].batch,
         "instances": c.instances,
         "worst_case_ms": round(c.latency_s * 1000, 2), "cost": round(c.cost, 3)}
        for s, c in choices.items()
    ]  # fmt: skip
    paths = [{"steps": list(p.steps), "sla_ms": round(p.sla_s * 1000, 2),
              "worst_case_ms": round(sum(choices[s].latency_s for s in p.steps) * 1000, 2)} for p in pipeline.paths]  # fmt: skip
    result = {"pipeline": name, "policy": args.policy, "rate": args.rate, "arrivals": arrivals, "steps": rows,
              "paths": paths, "functions_ms": {k: round(v, 3) for k, v in measured.functions_ms.items()},
              "gateway_cores": round(gateway_cores, 3), "not_planned": unplanned,
              "cost": round(sum(c.cost for c in choices.values()), 3), "planner_ms": round(took_ms, 3)}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"pipeline {name} at {args.rate:g} requests/s, policy {args.policy} (planned in {took_ms:.1f} ms)")
        print("| step | model | device | batch | instances | worst case (ms) | cost (cores) |")
        print("|---|---|---|---|---|---|---|")
        for row in rows:
            print(f"| {row['step']} | {row['model']} | {row['device']} | {row['batch']} | {row['instances']} "
                  f"| {row['worst_case_ms']} | {row['cost']} |")  # fmt: skip
        for path in paths:
            print(f"path {' -> '.join(path['steps'])}: worst case {path['worst_case_ms']} ms of {path['sla_ms']} ms")
        print(f"cost: {result['cost']} cores")
        if measured.functions_ms:
            spent = ", ".join(f"{k} {v:.1f} ms" for k, v in measured.functions_ms.items())
            print(f"function steps (in the gateway's process): {spent}; about {gateway_cores:.2f} cores at this rate")
        if unplanned:
            print(f"not planned (no rows on this sample, left as configured): {', '.join(unplanned)}")
    total_cores = sum(planned_cores(steps, choices).values())
    if total_cores > config.node.cpu_cores + ROUNDING:
        print(
            f"gateway plan: warning: the plan's models take {total_cores:g} cores together, over the node's "
            f"{config.node.cpu_cores:g} (node.cpu_cores): this node cannot hold {args.rate:g} requests/s",
            file=sys.stderr,
        )
    if args.apply:
        for line in apply(config, steps, choices):
            print(f"gateway plan: {line}", file=sys.stderr)
        print(f"written into {args.config}", file=sys.stderr)
    if args.apply_to:
        for line in apply_to(args.apply_to, args.token, steps, choices):
            print(f"set on {args.apply_to}: {line}", file=sys.stderr)
    return 0
