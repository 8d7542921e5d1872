"""Loading a ``gateway serve`` config: TOML in, a checked ``GatewayConfig`` out.

pydantic checks each value against the schema (``schema.py``); this module reads the file,
turns pydantic's findings into errors that name the file and the full key, resolves paths,
takes tokens from the environment, works out the defaults that depend on other values and
checks what spans several values. Every error is raised before anything starts.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import ipaddress
import json
import math
import os
import tomllib
import types
import typing
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.json_schema import GenerateJsonSchema

from controllers.pi import pi_gains
from gateway.config.schema import (
    MAX_MODEL_NAME,
    MIN_WORKER_TOKEN,
    MODEL_NAME_PATTERN,
    PIPELINE_INPUT,
    ClusterConfig,
    ConfigFile,
    CpuExecutorConfig,
    CpuTable,
    GatewayConfig,
    GpuConfig,
    GpuTable,
    ModelConfig,
    ModelTable,
    NodeConfig,
    PipelineTable,
    PlantConfig,
    ServerConfig,
    TracingConfig,
    WorkerConfig,
    default_threads,
)


class ConfigError(ValueError):
    """What is wrong with a config file: ``FILE: KEY: problem``, one line per problem found."""

    def __init__(self, source: Path | str, key: str, message: str, more: Sequence[tuple[str, str]] = ()):
        self.source, self.key = source, key
        lines = [f"{source}: {k}: {m}" for k, m in ((key, message), *more)]
        super().__init__("\n".join(lines))


@cache
def _file_adapter() -> TypeAdapter[ConfigFile]:
    return TypeAdapter(ConfigFile)


# /v2/models/stats is Triton's statistics of every model (gateway/routes.py): no model's name.
RESERVED_NAME = "stats"
# A name of dots only ("." or "..") is no URL path segment a model or pipeline can be served under.
DOTS_ONLY = {"pattern": r"^\.+$"}


class _Described(GenerateJsonSchema):
    """The schema without a title per property: each property's name and description say it."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def dict_schema(self, schema: Any) -> dict[str, Any]:
        """A table of [models.NAME] or [pipelines.NAME]: pydantic gives the name's pattern as
        patternProperties, which leaves a key outside it unchecked (any body passes); here every
        key is held to the loader's rule for a name, and every body to the table's schema."""
        generated = super().dict_schema(schema)
        tables = generated.get("patternProperties", {})
        if set(tables) == {MODEL_NAME_PATTERN}:
            del generated["patternProperties"]
            generated["additionalProperties"] = tables[MODEL_NAME_PATTERN]
            not_a_name = {"anyOf": [DOTS_ONLY, {"const": RESERVED_NAME}]}
            generated["propertyNames"] = {"pattern": MODEL_NAME_PATTERN, "maxLength": MAX_MODEL_NAME, "not": not_a_name}
        return generated


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a config file (TOML read as JSON), for editors and validators."""
    schema = _file_adapter().json_schema(schema_generator=_Described)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": "gateway serve config"}


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    source = Path(path)
    try:
        raw = tomllib.loads(source.read_text())
    except FileNotFoundError:
        raise ConfigError(source, "(file)", "no such file") from None
    except UnicodeDecodeError as error:
        raise ConfigError(source, "(file)", f"not UTF-8 text, as TOML must be ({error.reason} at byte {error.start})") from None
    except OSError as error:
        raise ConfigError(source, "(file)", f"cannot be read: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(source, "(syntax)", str(error)) from None
    if not raw.get("models"):
        raise ConfigError(source, "models", "at least one model is required, as a [models.NAME] table")
    _reject_dates(source, raw, "")
    try:
        # TOML's values (dates aside) are JSON's, and JSON mode lets strict checking take a
        # list for a tuple and a string for a path.
        file = _file_adapter().validate_json(json.dumps(raw), strict=True)
    except ValidationError as error:
        problems = _problems(error.errors(include_url=False))
        raise ConfigError(source, *problems[0], more=problems[1:]) from None

    base = source.resolve().parent
    server = _server(source, file.server, base)
    node = file.node
    control = file.control
    if not control.reserved_cores < node.cpu_cores:
        raise ConfigError(
            source, "control.reserved_cores", f"must be under node.cpu_cores ({node.cpu_cores}), got {control.reserved_cores}"
        )
    gpu = _gpu(source, file.gpu, node, base)
    # The node's cores are shared evenly by the CPU executors: a GPU-only model has none.
    cpu_models = sum(table.cpu_executor for table in file.models.values())
    default_cores = node.cpu_cores / max(1, cpu_models)
    models = {name: _model(source, name, table, server, node, gpu, default_cores) for name, table in file.models.items()}
    worker = dataclasses.replace(
        file.worker,
        token=_token("GATEWAY_WORKER_TOKEN", file.worker.token),
        tls_cert=base / file.worker.tls_cert if file.worker.tls_cert else None,
        tls_key=base / file.worker.tls_key if file.worker.tls_key else None,
    )
    _check_worker_tls(source, worker)
    cluster = file.cluster
    if cluster is not None:
        cluster = dataclasses.replace(
            cluster,
            token=_token("GATEWAY_WORKER_TOKEN", cluster.token),
            tls_ca=base / cluster.tls_ca if cluster.tls_ca else None,
        )
        _check_cluster(source, cluster)
        # A worker's status, once a control period, is its heartbeat: a timeout no longer than
        # the period took every healthy worker as down between two of them, again and again.
        if cluster.heartbeat_timeout_s <= file.control.period_s:
            raise ConfigError(
                source,
                "cluster.heartbeat_timeout_s",
                f"{cluster.heartbeat_timeout_s:g} s must be longer than control.period_s ({file.control.period_s:g} s): "
                "a worker's status, once a period, is its heartbeat",
            )
    _check_tracing(source, file.tracing)
    return GatewayConfig(
        source=source,
        server=server,
        node=node,
        policy=file.policy,
        control=control,
        gpu=gpu,
        docker=file.docker,
        models=models,
        worker=worker,
        cluster=cluster,
        pipelines=_check_pipelines(source, file.pipelines, models, base),
        tracing=file.tracing,
    )


def _check_pipelines(
    source: Path, pipelines: dict[str, PipelineTable], models: dict[str, ModelConfig], base: Path
) -> dict[str, PipelineTable]:
    """Each pipeline's DAG against the models it runs (their outputs read from their ONNX files)
    and the functions it calls; a pipeline's name is a model's name to clients, so it must be free."""
    if not pipelines:
        return pipelines
    import onnx

    from gateway.pipeline.functions import load_function
    from gateway.pipeline.graph import PipelineError, PipelineGraph

    outputs, inputs = {}, {}
    typed: dict[tuple[str, str, str], _Tensor] = {}  # (model, "input" or "output", name) -> its type
    for name, model in models.items():
        if any(name == step.model for table in pipelines.values() for step in table.steps):
            try:
                graph = onnx.load(str(model.path), load_external_data=False).graph
            except Exception as error:  # protobuf's DecodeError and onnx's own: not an ONNX file
                raise ConfigError(source, f"models.{name}.path", f"{model.path} is not an ONNX model: {error}") from None
            outputs[name] = [o.name for o in graph.output]
            weights = {w.name for w in graph.initializer}  # listed as inputs by older exporters
            inputs[name] = [i.name for i in graph.input if i.name not in weights]
            for side, values in (("input", graph.input), ("output", graph.output)):
                typed.update({(name, side, v.name): _onnx_tensor(v) for v in values if v.name not in weights})
        else:
            outputs[name] = []
    for name, table in pipelines.items():
        key = f"pipelines.{name}"
        _check_url_name(source, key, name)
        if name in models:
            raise ConfigError(source, key, f"'{name}' is a model's name too; a pipeline is served as a model of its own name")
        for side, tensors in (("inputs", table.inputs), ("outputs", table.outputs)):
            seen = [t.name for t in tensors]
            twice = sorted({n for n in seen if seen.count(n) > 1})
            if twice:
                raise ConfigError(source, f"{key}.{side}", f"{', '.join(repr(n) for n in twice)} named more than once")
        try:
            PipelineGraph.build(name, table, outputs)
        except PipelineError as error:
            raise ConfigError(source, key, str(error)) from None
        for i, step in enumerate(table.steps):
            if step.model is not None and step.model in inputs:
                # Fed by name: a name the model does not have fed nothing, and every request was a 500.
                wanted = inputs[step.model]
                odd, unfed = sorted(set(step.inputs) - set(wanted)), [n for n in wanted if n not in step.inputs]
                if odd or unfed:
                    problem = (
                        f"model '{step.model}' has no input {odd[0]!r}"
                        if odd
                        else f"model '{step.model}''s input {unfed[0]!r} is fed nothing"
                    )
                    raise ConfigError(source, f"{key}.steps[{i}].inputs", f"{problem} (its inputs: {', '.join(wanted)})")
            if step.function is not None:
                try:
                    load_function(step.function, base)
                except ValueError as error:
                    raise ConfigError(source, f"{key}.steps[{i}].function", str(error)) from None
        _check_wiring(source, key, table, typed)
    return pipelines


@dataclasses.dataclass(frozen=True)
class _Tensor:
    datatype: str | None  # None: no KServe datatype (ONNX's bfloat16, say), nothing to compare
    shape: tuple[int, ...] | None  # -1 where free; None: no shape given


def _onnx_tensor(value: Any) -> _Tensor:
    """A model input's or output's type, read from its ONNX ValueInfoProto."""
    import numpy as np
    import onnx

    from executors.tensors import KSERVE_TO_NUMPY

    kind = value.type.tensor_type
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type))
        datatype = next((n for n, d in KSERVE_TO_NUMPY.items() if d == dtype), None)
    except (KeyError, TypeError):  # an element type numpy has no name for
        datatype = None
    shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim) if kind.HasField("shape") else None
    return _Tensor(datatype, shape)


def _mismatch(given: _Tensor, wanted: _Tensor) -> str | None:
    """Why a tensor of type ``given`` can never be fed where ``wanted`` is read, or None. Floats
    pass to other floats and integers to other integers (the pipeline converts them where each
    value fits, gateway/pipeline/runner.py); any other datatype that differs fails every request."""
    from executors.tensors import KSERVE_TO_NUMPY

    if given.datatype and wanted.datatype and given.datatype != wanted.datatype:
        kinds = KSERVE_TO_NUMPY[given.datatype].kind, KSERVE_TO_NUMPY[wanted.datatype].kind
        if not (kinds[0] == kinds[1] == "f" or set(kinds) <= set("iu")):
            return f"{given.datatype} where {wanted.datatype} is wanted"
    if given.shape is not None and wanted.shape is not None:
        if len(given.shape) != len(wanted.shape):
            return f"shape {list(given.shape)} where {len(wanted.shape)} dimensions {list(wanted.shape)} are wanted"
        if any(g >= 0 and w >= 0 and g != w for g, w in zip(given.shape, wanted.shape, strict=True)):
            return f"shape {list(given.shape)} where {list(wanted.shape)} is wanted"
    return None


def _check_wiring(source: Path, key: str, table: PipelineTable, typed: dict[tuple[str, str, str], _Tensor]) -> None:
    """Each edge whose two ends have known types: the pipeline's input into a model, a model's
    output into another model, a model's output as the pipeline's output. A datatype or a fixed
    dimension that can never agree was a 500 on every request; it is a config error instead.
    (A function's tensors have no declared type: their edges are checked per request.)"""
    model_of = {step.name: step.model for step in table.steps}
    declared = {t.name: _Tensor(t.datatype, t.shape) for t in table.inputs}

    def given(reference: str) -> _Tensor | None:
        step, _, tensor = reference.partition("/")
        if step == PIPELINE_INPUT:
            return declared.get(tensor)
        model = model_of.get(step)
        return typed.get((model, "output", tensor)) if model is not None else None

    for i, step in enumerate(table.steps):
        if step.model is None:
            continue
        for name, reference in step.inputs.items():
            fed, wanted = given(reference), typed.get((step.model, "input", name))
            problem = _mismatch(fed, wanted) if fed is not None and wanted is not None else None
            if problem:
                raise ConfigError(
                    source, f"{key}.steps[{i}].inputs", f"'{reference}' into model '{step.model}''s input '{name}': {problem}"
                )
    for j, output in enumerate(table.outputs):
        fed = given(output.source) if output.source is not None else None
        problem = _mismatch(fed, _Tensor(output.datatype, output.shape)) if fed is not None else None
        if problem:
            raise ConfigError(source, f"{key}.outputs[{j}]", f"'{output.source}' as output '{output.name}': {problem}")


def _check_tracing(source: Path, tracing: TracingConfig) -> None:
    """Tracing is an optional extra: switched on without it, the gateway says so before it starts."""
    if not tracing.enabled:
        return
    from gateway.tracing import missing_packages

    missing = missing_packages()
    if missing:
        raise ConfigError(
            source,
            "tracing.enabled",
            f"true needs the tracing extra, and {', '.join(missing)} cannot be imported: pip install 'sla-gateway[tracing]'",
        )


def _check_cluster(source: Path, cluster: ClusterConfig) -> None:
    from gateway.cluster.discovery import parse_workers

    try:
        parse_workers(cluster.workers if isinstance(cluster.workers, str) else list(cluster.workers))
    except ValueError as error:
        raise ConfigError(source, "cluster.workers", str(error)) from None
    problem = worker_token_error(cluster.token)
    if problem is not None:
        raise ConfigError(source, "cluster.token", problem)
    if cluster.tls_ca is not None:
        from gateway.cluster.tls import client_context

        try:
            client_context(cluster.tls_ca)
        except (OSError, ValueError) as error:
            raise ConfigError(source, "cluster.tls_ca", f"cannot read CA certificates from {cluster.tls_ca}: {error}") from None


def _check_worker_tls(source: Path, worker: WorkerConfig) -> None:
    """A certificate needs its key and the other way round; both must load (a wrong key fails
    here, not at a dispatcher's first connect)."""
    if worker.tls_cert is None and worker.tls_key is None:
        return
    if worker.tls_cert is None or worker.tls_key is None:
        missing = "worker.tls_key" if worker.tls_key is None else "worker.tls_cert"
        raise ConfigError(source, missing, "TLS needs both worker.tls_cert and worker.tls_key")
    from gateway.cluster.tls import server_context

    try:
        server_context(worker.tls_cert, worker.tls_key)
    except (OSError, ValueError) as error:
        raise ConfigError(
            source, "worker.tls_cert", f"cannot load {worker.tls_cert} with its key {worker.tls_key}: {error}"
        ) from None


def worker_token_error(token: str | None) -> str | None:
    """Why ``token`` cannot guard a worker's executors, or None."""
    if token is None:
        return "the workers need a shared token: set GATEWAY_WORKER_TOKEN (or the token key)"
    if len(token) < MIN_WORKER_TOKEN:
        return f"the worker token must have at least {MIN_WORKER_TOKEN} characters, it has {len(token)}"
    return None


def _server(source: Path, server: ServerConfig, base: Path) -> ServerConfig:
    return dataclasses.replace(
        server,
        admin_token=_token("GATEWAY_ADMIN_TOKEN", server.admin_token),
        data_token=_token("GATEWAY_DATA_TOKEN", server.data_token),
        model_dir=_resolved(source, "server.model_dir", base / server.model_dir) if server.model_dir else base,
    )


def _resolved(source: Path, key: str, path: Path) -> Path:
    """``path`` made absolute, its links followed; a path no file can have (a NUL character, a
    link to itself, a name over the system's limit) is ``key``'s error, not a traceback."""
    if "\0" in str(path):
        raise ConfigError(source, key, "a path cannot hold a NUL character")
    try:
        return path.resolve()
    except (OSError, RuntimeError) as error:  # RuntimeError: a loop of symbolic links
        raise ConfigError(source, key, f"cannot be resolved: {error}") from None


def _token(variable: str, configured: str | None) -> str | None:
    """A token from the environment wins over the config's; an empty one is none. Whitespace
    around it is no part of it: an HTTP header's value loses it (RFC 9110 5.5), and a secret
    file or ``echo`` ends in a newline, which locked every client out."""
    return (os.environ.get(variable) or "").strip() or (configured or "").strip() or None


def _gpu(source: Path, table: GpuTable, node: NodeConfig, base: Path) -> GpuConfig:
    profile = base / table.profile if table.profile else None
    gpu = GpuConfig(**{**vars(table), "profile": profile})
    if gpu.executor == "emulated" and node.gpus:
        if profile is None:
            raise ConfigError(source, "gpu.profile", "an emulated GPU needs a profile CSV (model, alpha_ms, beta_ms)")
        gpu = dataclasses.replace(gpu, profiles=_read_profiles(source, profile), footprints=_read_footprints(source, profile))
    return gpu


def _model(
    source: Path,
    name: str,
    table: ModelTable,
    server: ServerConfig,
    node: NodeConfig,
    gpu: GpuConfig,
    default_cores: float,
    on_gpus: bool = True,
) -> ModelConfig:
    """``on_gpus``: the node's GPUs serve the model too (a model loaded at run time is served by
    its CPU executor alone, so an emulated GPU needs no profile row for it)."""
    key = f"models.{name}"
    _check_url_name(source, key, name)
    path = table.path if table.path.is_absolute() else source.resolve().parent / table.path
    assert server.model_dir is not None
    if not _resolved(source, f"{key}.path", path).is_relative_to(server.model_dir):
        raise ConfigError(source, f"{key}.path", f"{path} is outside the model directory {server.model_dir} (server.model_dir)")
    try:
        found = path.is_file()
    except OSError as error:  # a name over the system's limit
        raise ConfigError(source, f"{key}.path", f"cannot be read: {error}") from None
    if not found:
        raise ConfigError(source, f"{key}.path", f"no ONNX file at {path}")
    cpu = _cpu(source, f"{key}.cpu", table.cpu, node, default_cores) if table.cpu_executor else None
    if table.dispatch_batch > table.max_batch_size:
        problem = f"{table.dispatch_batch} is over max_batch_size ({table.max_batch_size})"
        raise ConfigError(source, f"{key}.dispatch_batch", problem)
    if not table.cpu_executor:
        _check_gpu_only(source, key, table, node)
    try:
        pi_gains(table.plant.gain, table.plant.zero, table.plant.pole)
    except (ValueError, ArithmeticError) as error:
        raise ConfigError(source, f"{key}.plant", str(error)) from None
    if table.default_priority is not None and table.default_priority > table.priority_levels:
        raise ConfigError(
            source, f"{key}.default_priority", f"{table.default_priority} is over priority_levels ({table.priority_levels})"
        )
    row = table.gpu_profile or name
    if on_gpus and gpu.executor == "emulated" and node.gpus and row not in gpu.profiles:
        raise ConfigError(source, f"{key}.gpu_profile", f"{gpu.profile} has no row {row!r} for this model")
    if on_gpus and gpu.memory_mb is not None and node.gpus:
        if gpu.executor == "emulated" and row not in gpu.footprints:
            raise ConfigError(
                source, "gpu.memory_mb", f"{gpu.profile} needs the columns memory_mb and load_ms for model {name!r} (row {row!r})"
            )
        size_mb = gpu.footprints[row][0] if gpu.executor == "emulated" else path.stat().st_size / 2**20
        if size_mb > gpu.memory_mb:
            raise ConfigError(
                source, "gpu.memory_mb", f"model {name!r} needs {size_mb:g} MB, over the {gpu.memory_mb:g} MB of a GPU"
            )
    # cpu_executor = false is carried as no CPU executor config: ModelConfig.cpu is None.
    fields = {f.name: getattr(table, f.name) for f in dataclasses.fields(table) if f.name != "cpu_executor"}
    return ModelConfig(**{**fields, "name": name, "path": path, "cpu": cpu})


def _check_url_name(source: Path, key: str, name: str) -> None:
    """A model's or pipeline's name is a path segment of its URLs: one of dots only is none, and
    "stats" is taken (GET /v2/models/stats is every model's statistics, Triton's route)."""
    if not name.strip("."):
        raise ConfigError(source, key, f"'{name}' is no name a URL can carry (a path segment of dots only)")
    if name == RESERVED_NAME:
        raise ConfigError(
            source, key, f"'{name}' is taken: GET /v2/models/{name} answers every model's statistics, never this model's metadata"
        )


def _check_gpu_only(source: Path, key: str, table: ModelTable, node: NodeConfig) -> None:
    """A model without a CPU executor needs GPUs to run on, and has no CPU executor or CPU
    controller to configure: settings for them would be silently ignored."""
    if not node.gpus:
        raise ConfigError(
            source,
            f"{key}.cpu_executor",
            "false needs GPUs (node.gpus): without its CPU executor the model would have no device to run on",
        )
    for name, default in (("cpu", CpuTable()), ("plant", PlantConfig())):
        if getattr(table, name) != default:
            raise ConfigError(
                source, f"{key}.{name}", "this model has no CPU executor (cpu_executor = false): nothing to configure here"
            )


def _cpu(source: Path, key: str, table: CpuTable, node: NodeConfig, default_cores: float) -> CpuExecutorConfig:
    cores = table.cores if table.cores is not None else default_cores
    max_cores = table.max_cores if table.max_cores is not None else node.cpu_cores
    if max_cores > node.cpu_cores:
        problem = f"{max_cores:g} is over the node's {node.cpu_cores:g} cores (node.cpu_cores)"
        raise ConfigError(source, f"{key}.max_cores", problem)
    if not table.min_cores <= cores <= max_cores:
        raise ConfigError(source, f"{key}.cores", f"must lie in [min_cores, max_cores] = [{table.min_cores}, {max_cores}]")
    threads = table.threads if table.threads is not None else default_threads(cores, max_cores)
    return CpuExecutorConfig(
        cores=cores, threads=threads, min_cores=table.min_cores, max_cores=max_cores, memory_mb=table.memory_mb
    )


def exposure_error(server: ServerConfig) -> str | None:
    """Why the gateway must not listen where it is asked to, or None.

    The admin API changes SLAs and cores: on any address but loopback it needs a token.
    """
    if server.admin_token is not None or server.host == "localhost":
        return None
    try:
        if ipaddress.ip_address(server.host).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to anything
    return (
        f"refusing to serve the admin API on {server.host}, which is not a loopback address, without a token: "
        "set GATEWAY_ADMIN_TOKEN (or server.admin_token), or listen on 127.0.0.1"
    )


def _read_profiles(source: Path, path: Path) -> dict[str, tuple[float, float]]:
    """model -> (per-item ms, fixed ms) from a zoo CSV such as ../shared/data/symphony_zoo_a100.csv."""
    rows = _profile_rows(source, path)
    return {row["model"]: _numbers(source, path, row, ("alpha_ms", "beta_ms")) for row in rows}


def _read_footprints(source: Path, path: Path) -> dict[str, tuple[float, float]]:
    """model -> (memory MB, load ms) where the profile has the columns memory_mb and load_ms."""
    rows = _profile_rows(source, path)
    if not rows or not {"memory_mb", "load_ms"} <= rows[0].keys():
        return {}
    return {row["model"]: _numbers(source, path, row, ("memory_mb", "load_ms")) for row in rows}


def _profile_rows(source: Path, path: Path) -> list[dict[str, str]]:
    try:
        with path.open() as handle:
            rows = list(csv.DictReader(handle))
    except FileNotFoundError:
        raise ConfigError(source, "gpu.profile", f"no such file {path}") from None
    except (OSError, ValueError, csv.Error) as error:  # ValueError: a NUL in the path, text no UTF-8
        raise ConfigError(source, "gpu.profile", f"cannot read {path}: {error}") from None
    if not rows or "model" not in rows[0]:
        raise ConfigError(source, "gpu.profile", f"{path} needs the columns model, alpha_ms, beta_ms")
    return rows


def _numbers(source: Path, path: Path, row: dict[str, str], columns: tuple[str, str]) -> tuple[float, float]:
    """A row's two columns as milliseconds or megabytes: finite numbers of at least 0."""
    values = []
    for column in columns:
        text = row.get(column)
        try:
            value = float(text) if isinstance(text, str) else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            problem = "is missing" if text is None else f"is {text!r}, not a finite number of at least 0"
            raise ConfigError(source, "gpu.profile", f"{path}: row {row.get('model')!r}: {column} {problem}")
        values.append(value)
    return values[0], values[1]


# -- pydantic's findings as FILE: KEY: problem ------------------------------------------------


def _reject_dates(source: Path, value: Any, key: str) -> None:
    """TOML has dates and times; no key of this config takes one."""
    if isinstance(value, dict):
        for name, item in value.items():
            _reject_dates(source, item, f"{key}.{name}" if key else name)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _reject_dates(source, item, f"{key}[{index}]")
    elif isinstance(value, datetime.date | datetime.time):
        raise ConfigError(source, key, f"is a date or a time ({value}); no key of this config takes one")


KINDS = {
    "float": "a number",
    "int": "an integer",
    "bool": "true or false",
    "string": "a string",
    "dict": "a table",
    "dataclass": "a table",
    "list": "a list",
    "tuple": "a list",
}


def _problems(errors: list[Any]) -> list[tuple[str, str]]:
    """(full key, what is wrong) for pydantic's errors, less those that only echo another: the
    branch of a choice (``str | tuple[...]``) that the value is not even the kind of, and a list
    too short only because its items were refused."""
    for error in errors:
        error["loc"] = tuple(_without_branches([part for part in error["loc"] if part != "[key]"]))
    kept = []
    for error in errors:
        key = error["loc"]
        if error["type"] == "too_short" and any(e["loc"][: len(key)] == key and len(e["loc"]) > len(key) for e in errors):
            continue
        if error["type"].endswith("_type") and any(e is not error and e["loc"][: len(key)] == key for e in errors):
            continue  # not this branch's kind of value: another branch says what is wrong with it
        kept.append(error)
    return [_problem(e) for e in kept or errors]


def _without_branches(loc: list[str | int]) -> list[str | int]:
    """``loc`` less pydantic's names of a choice's branches (``str``, ``tuple[...]``): no key of the file."""
    kept: list[str | int] = []
    kind: Any = ConfigFile
    parts = iter(loc)
    for part in parts:
        if _branches(kind) and isinstance(part, str):
            kind = next((b for b in _branches(kind) if _branch_name(b) == part.split("[", 1)[0]), kind)
            continue
        kept.append(part)
        try:
            kind = _step(kind, part)
        except (KeyError, IndexError):  # an unknown key: nothing under it is declared
            return kept + list(parts)
    return kept


def _branches(kind: Any) -> tuple[Any, ...]:
    """The types of a choice (``str | tuple[HostPort, ...]``), None aside; () for one type."""
    bare = _bare(kind)
    return typing.get_args(bare) if typing.get_origin(bare) in (typing.Union, types.UnionType) else ()


def _branch_name(kind: Any) -> str:
    bare = _bare(kind)
    origin = typing.get_origin(bare) or bare
    return getattr(origin, "__name__", "")


def _problem(error: Any) -> tuple[str, str]:
    """(full key, what is wrong) for one of pydantic's errors, in the words of this config."""
    loc = list(error["loc"])
    key = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc)) or "(top level)"
    kind, value = error["type"], error.get("input")
    got = "a boolean" if isinstance(value, bool) else f"{type(value).__name__} {value!r}"
    if kind == "missing":
        return key, "is required"
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        known = _known_keys(loc[:-1])
        return key, f"unknown key (known: {', '.join(known)})"
    if kind.endswith("_type") and kind.removesuffix("_type") in KINDS:
        return key, f"must be {KINDS[kind.removesuffix('_type')]}, got {got}"
    if kind == "literal_error":
        known = typing.get_args(_bare(_field_type(loc)))
        return key, f"unknown {loc[-1]} {value!r} (known: {', '.join(known)})"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"):
        return key, f"must be {_bounds(loc)}, got {value!r}"
    if kind == "string_pattern_mismatch" and error["ctx"]["pattern"] == MODEL_NAME_PATTERN:
        return key, "a model name may hold letters, digits, '_', '-' and '.' only"
    if kind == "value_error":
        return key, str(error["ctx"]["error"])
    return key, error["msg"]


def _field_type(loc: Sequence[str | int]) -> Any:
    """The declared type at a key of the file, with its Annotated limits kept."""
    kind: Any = ConfigFile
    for part in loc:
        kind = _step(kind, part)
    return kind


def _step(kind: Any, part: str | int) -> Any:
    """The declared type at ``part`` of a value of type ``kind``; of a choice's branches, the
    one ``part`` can be in (an index: the list's; a key: the table's)."""
    for branch in _branches(kind):
        bare = _bare(branch)
        if isinstance(part, int) == (typing.get_origin(bare) is tuple):
            kind = branch
            break
    kind = _bare(kind)
    if dataclasses.is_dataclass(kind):
        return typing.get_type_hints(kind, include_extras=True)[str(part)]
    if typing.get_origin(kind) is dict:
        return typing.get_args(kind)[1]
    return typing.get_args(kind)[0]  # a tuple's item


def _unwrap(kind: Any) -> tuple[Any, list[Any]]:
    """The type under Annotated[...] and ... | None, and the Annotated metadata met on the way."""
    metadata: list[Any] = []
    while True:
        if typing.get_origin(kind) is typing.Annotated:
            kind, *extra = typing.get_args(kind)
            metadata += extra
        elif type(None) in typing.get_args(kind):
            kind = next(k for k in typing.get_args(kind) if k is not type(None))
        else:
            return kind, metadata


def _bare(kind: Any) -> Any:
    return _unwrap(kind)[0]


def _known_keys(loc: Sequence[str | int]) -> list[str]:
    table = _bare(_field_type(loc))
    return sorted(f.name for f in dataclasses.fields(table)) if dataclasses.is_dataclass(table) else []


def _bounds(loc: Sequence[str | int]) -> str:
    """A number's limits in words: 'a positive number', '0-65535', 'in (0, 1]'."""
    kind, metadata = _unwrap(_field_type(loc))
    limits: dict[str, float] = {}
    for meta in metadata:
        for item in getattr(meta, "metadata", [meta]):  # a Field's annotated_types.Gt, Le, ...
            limits |= {name: getattr(item, name) for name in ("gt", "ge", "lt", "le") if getattr(item, name, None) is not None}
    low = ("gt", limits["gt"]) if "gt" in limits else ("ge", limits["ge"]) if "ge" in limits else None
    high = ("lt", limits["lt"]) if "lt" in limits else ("le", limits["le"]) if "le" in limits else None
    if low == ("gt", 0) and high is None:
        return "a positive number"
    if low and high:
        if low[0] == "ge" and high[0] == "le":
            return f"{low[1]}-{high[1]}" if kind is int else f"between {low[1]} and {high[1]}"
        return f"in {'(' if low[0] == 'gt' else '['}{low[1]}, {high[1]}{')' if high[0] == 'lt' else ']'}"
    if low:
        return f"{'over' if low[0] == 'gt' else 'at least'} {low[1]}"
    if high:
        return f"{'under' if high[0] == 'lt' else 'at most'} {high[1]}"
    return "a finite number"
