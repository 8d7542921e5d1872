"""The schema of ``config.toml``: one typed class per TOML table, with its defaults and limits.

pydantic checks a file against these classes (types, limits, allowed values, unknown keys) and
writes their JSON Schema (``gateway config-schema``); the docstring under a field is its
description there. What depends on more than one value (paths under the model directory,
cores within their bounds, the GPU profile's rows) is checked by the loader, ``loading.py``.

Most tables are used as they are written. Three are worked out by the loader first: the
``*Table`` classes are the file, the ``*Config`` ones what the gateway runs with.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, ConfigDict, Field, with_config

from controllers.feedforward import FEEDFORWARD_SETPOINT
from controllers.pi import DEFAULT_GAIN, DEFAULT_POLE, DEFAULT_ZERO
from controllers.sla_measure import SlaMeasure
from schedulers.dispatch import SPILL_WITHIN
from schedulers.gpu import DEFAULT_POLICY, POLICIES

DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
# Triton's HTTP endpoint accepts bodies up to 64 MiB by default; a 640x640 image as JSON fits.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# A KServe request nests a few levels plus one per tensor dimension.
DEFAULT_MAX_JSON_DEPTH = 32
# 64 MiB of FP32: the most a default-size binary body can carry.
DEFAULT_MAX_ELEMENTS = 16 * 1024 * 1024
DEFAULT_REQUEST_TIMEOUT_MS = 60_000.0
DEFAULT_DRAIN_TIMEOUT_S = 10.0
# A KServe client writes its request line and headers at once; nginx's client_header_timeout is
# 60 s and Apache's mod_reqtimeout 20-40 s for browsers on slow links, the gateway's clients are
# programs on a data-centre network.
DEFAULT_HEADER_TIMEOUT_S = 5.0
# Under the usual descriptor limit of 1024, which lowers it further (gateway/connections.py).
DEFAULT_MAX_CONNECTIONS = 1000
# Infer answers shorter than this are never compressed (``compress_min_bytes``).
DEFAULT_COMPRESS_MIN_BYTES = 64 * 1024
DEFAULT_MAX_QUEUE_SIZE = 1024
DEFAULT_MAX_BATCH_SIZE = 32
# ROMA's own controller clamps at 0.1 core: less leaves a model unable to answer at all.
DEFAULT_MIN_CORES = 0.1
# ONNX Runtime's intra-op threads of one executor: more than any node has cores is a typo (one
# of 100,000 took 16 GB before its first request).
MAX_THREADS = 256
# A batch that takes 10 SLAs (at least 2 s) is not slow, it is stuck.
HANG_TIMEOUT_SLAS = 10
MIN_HANG_TIMEOUT_MS = 2000.0

# Every table: no unknown key (a misspelt knob must not be silently ignored), no coercion (a
# string is not a number, a boolean is never one), no infinity or NaN.
TABLE = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, use_attribute_docstrings=True)

PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
Share = Annotated[float, Field(ge=0, le=1)]
MODEL_NAME_PATTERN = r"^[\w.-]+$"
# A name is a URL path segment and part of its executor's socket path (108 bytes at most, with
# the socket folder's), so it is kept short; one of dots only ("." or "..") is refused too.
MAX_MODEL_NAME = 64
ModelName = Annotated[str, Field(pattern=MODEL_NAME_PATTERN, max_length=MAX_MODEL_NAME)]


def _distinct(ids: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(ids)) != len(ids):
        raise ValueError(f"must be distinct GPU device ids such as [0, 1], got {list(ids)}")
    return ids


def _host_cores() -> float:
    return float(os.cpu_count() or 1)


ExecutorBackend = Literal["process", "docker"]
GpuExecutor = Literal["cuda", "emulated"]
GpuPolicy = Literal[POLICIES]  # type: ignore[valid-type]  # schedulers/gpu.py's names
ControlPolicy = Literal["fixed", "pi", "feedforward", "rules", "max", "min"]
GrantRule = Literal["proportional", "deficit"]
SlaMeasureName = Literal["mean", "percentile", "deadline"]
Actuator = Literal["auto", "cgroup", "affinity"]
EXECUTOR_BACKENDS: tuple[str, ...] = get_args(ExecutorBackend)
GPU_EXECUTORS: tuple[str, ...] = get_args(GpuExecutor)
GPU_POLICIES: tuple[str, ...] = POLICIES
CONTROL_POLICIES: tuple[str, ...] = get_args(ControlPolicy)
ACTUATORS: tuple[str, ...] = get_args(Actuator)


@with_config(TABLE)
@dataclass(frozen=True)
class ServerConfig:
    """[server]: where the gateway listens, its limits on requests, its tokens."""

    host: str = DEFAULT_HOST
    """Address to listen on; anything but loopback needs an admin token."""
    port: Annotated[int, Field(ge=0, le=65535)] = DEFAULT_PORT
    grpc_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """The KServe v2 gRPC service on this port of the same host (Triton's is 8001); 0: none."""
    max_body_bytes: PositiveInt = DEFAULT_MAX_BODY_BYTES
    max_json_depth: PositiveInt = DEFAULT_MAX_JSON_DEPTH
    max_elements: PositiveInt = DEFAULT_MAX_ELEMENTS
    """Most tensor elements one request may carry."""
    request_timeout_ms: PositiveFloat = DEFAULT_REQUEST_TIMEOUT_MS
    """Every request ends: a client's own timeout (the protocol's ``timeout`` parameter, in
    microseconds as Triton reads it) is capped by this, which also applies when it gives none."""
    drain_timeout_s: PositiveFloat = DEFAULT_DRAIN_TIMEOUT_S
    """On SIGTERM/SIGINT, how long the requests in flight may take to finish."""
    header_timeout_s: PositiveFloat = DEFAULT_HEADER_TIMEOUT_S
    """A connection that has not sent a full request line and headers this long after its accept,
    or after the first byte of its next request, is closed (slowloris)."""
    max_connections: PositiveInt = DEFAULT_MAX_CONNECTIONS
    """Most connections open at once, lowered to stay under the descriptor limit (``ulimit -n``);
    at the cap, the one that has waited longest without a request in progress is closed."""
    compress_min_bytes: Annotated[int, Field(ge=0)] = DEFAULT_COMPRESS_MIN_BYTES
    """An infer answer at least this long is compressed in the gzip or deflate the client's
    Accept-Encoding asks for (tritonclient's ``response_compression_algorithm``); a shorter one
    never: python-requests and aiohttp ask for gzip by default, and gzip (zlib's default level)
    cost the gateway's process 0.2 ms of CPU a request for the example MLP's 10 KB answer (0.66
    against 0.46 ms in all, docs/BENCHMARKS.md), to save well under a millisecond of a fast
    network's time. 0: all."""
    admin_token: str | None = None
    """Bearer token of the admin API; the environment's GATEWAY_ADMIN_TOKEN wins."""
    data_token: str | None = None
    """Bearer token of the data plane; GATEWAY_DATA_TOKEN wins; none: the data plane is open."""
    model_dir: Path | None = None
    """Model files must lie under it (default: the config file's folder)."""


@with_config(TABLE)
@dataclass(frozen=True)
class NodeConfig:
    """[node]: the devices of this node."""

    cpu_cores: PositiveFloat = field(default_factory=_host_cores)
    """Cores the executors share (default: this host's CPU count)."""
    gpus: Annotated[
        tuple[Annotated[int, Field(ge=0)], ...], AfterValidator(_distinct), Field(json_schema_extra={"uniqueItems": True})
    ] = ()
    """GPU device ids, such as [0, 1]."""
    executor_backend: ExecutorBackend = "process"
    """process: OS processes; docker: one container each."""


@with_config(TABLE)
@dataclass(frozen=True)
class GpuTable:
    """[gpu]: GPU executors and their scheduler (ROMA Algorithm 1, Symphony Section 4.3)."""

    executor: GpuExecutor = "cuda"
    """cuda (ONNX Runtime's CUDA provider) or emulated (each batch held for the profile's l(b))."""
    policy: GpuPolicy = DEFAULT_POLICY
    queue_weight: Share = 0.5
    """ROMA's beta: weight of the queue's estimate against the measured response time."""
    profile: Path | None = None
    """CSV (model, alpha_ms, beta_ms): the emulated GPU's l(b); relative to the config file."""
    cpu_sharing: Literal["spill", "greedy"] = "spill"
    """How CPU executors share a queue with the GPUs: spill takes only what the GPUs' projected
    capacity cannot finish in time; greedy takes anything (work-conserving, for comparison)."""
    spill_within: Annotated[float, Field(gt=0, le=1)] = SPILL_WITHIN
    """spill: the GPUs keep a request only if they can answer it within this share of its SLA
    (the other models' requests due before it counted ahead of it); the CPU takes the rest."""
    emulated_outputs: Literal["computed", "zeros"] = "computed"
    """What an emulated GPU answers: computed (real outputs, computed on the CPU while the batch
    is held for l(b)) or zeros (no computation: for benchmarks of scheduling only)."""
    memory_mb: PositiveFloat | None = None
    """Each GPU's memory for models (Clockwork's cache): a GPU holds the models that fit, loads
    one on demand and unloads the least recently used; default: every GPU holds every model.
    A model's size and load time: the profile's memory_mb and load_ms columns (emulated), else
    its ONNX file's size and cuda_load_ms."""
    cuda_load_ms: PositiveFloat = 500.0
    """What the scheduler counts for loading a model onto a real GPU (session creation)."""
    warmup: bool = True
    """A real GPU executor runs each model on zeros at each batch size it will see (batch_shapes)
    before it says it is ready (Triton's model warm-up), so that loading CUDA's kernels and
    planning the convolutions of each size are not paid by the first requests nor learnt as l(b)
    (up to 600 ms for a CNN's first batch on an H200). A model that fails on zeros is served
    unwarmed. Models with a free
    dimension besides the batch are not warmed (their shapes come from requests), nor any model
    where memory_mb makes GPU memory a cache (it holds no session at start)."""
    batch_shapes: Literal["fixed", "exact"] = "fixed"
    """fixed: a real GPU runs each model at a few batch sizes (the powers of two below its
    max_batch_size, and that), a batch padded with zero rows to the next, one ONNX Runtime session
    (its own copy of the weights and memory arena) per size: the CUDA provider re-plans a convolution whenever its
    input shape changes (21-48 ms a batch on an H200 against 0.1-0.4 ms for the batch), and a
    dynamic batcher's sizes change nearly every batch (executors/batch_shapes.py). exact: one
    session, each batch at its own size. Models with another free dimension than the batch, or
    outputs without one, run exact either way, and so does every model where memory_mb makes GPU
    memory a cache (its footprint is one copy of the weights)."""
    cudnn_conv_algo_search: Literal["exhaustive", "heuristic", "default"] = "exhaustive"
    """ONNX Runtime's CUDA provider: how cuDNN picks a convolution's algorithm on the first run of
    a shape: exhaustive (times them all), heuristic (cuDNN's guess), default (the fixed one)."""


@dataclass(frozen=True)
class GpuConfig(GpuTable):
    """[gpu] as the gateway runs it: with the emulated GPU's profile read."""

    profiles: dict[str, tuple[float, float]] = field(default_factory=dict)
    """model -> (per-item ms, fixed ms), from ``profile``."""
    footprints: dict[str, tuple[float, float]] = field(default_factory=dict)
    """model -> (memory MB, load ms), from ``profile``'s memory_mb and load_ms columns where it has them."""


@with_config(TABLE)
@dataclass(frozen=True)
class DockerConfig:
    """[docker]: the Docker executor backend (executors/container.py)."""

    image: str = "sla-gateway-executor:host"
    host_runtime: bool = True
    """Run the host's Python, packages and checkout, bind-mounted read-only into a minimal root
    made with ``docker import``; false for a self-contained image from executors/Dockerfile."""


@with_config(TABLE)
@dataclass(frozen=True)
class PolicyConfig:
    """[policy]: the CPU scheduler."""

    cpu_scheduler: Literal["round_robin"] = "round_robin"
    seed: int | None = None


@with_config(TABLE)
@dataclass(frozen=True)
class ControlConfig:
    """[control]: the CPU control plane (ROMA Sections 3-5): which controller, how often, how arbitrated."""

    policy: ControlPolicy = "fixed"
    """fixed (cores as configured), pi (ROMA's CT), feedforward (ours: predicted from the
    measured load, corrected by ROMA's PI), rules, max, min."""
    period_s: Annotated[float, Field(ge=0.01)] = 1.0
    """ROMA's control period, at least 10 ms: one shorter than a control step takes (1e-9 s) left
    the loop no moment to wait in, and the gateway never served, nor heard SIGTERM."""
    setpoint_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8
    """ROMA's alpha: the set point is alpha x SLA."""
    feedforward_setpoint_ratio: Annotated[float, Field(gt=0, le=1)] = FEEDFORWARD_SETPOINT
    """The feedforward policy's own alpha: above ROMA's 0.8, because its prediction plans for the
    Poisson noise of the arrivals and a utilisation cap already (controllers/feedforward.py)."""
    spare_share: Share = 0.0
    """ROMA's gamma: share of the spare cores handed out."""
    grant: GrantRule = "proportional"
    """Under contention: proportional (ROMA Algorithm 2's eta) or deficit (shares in proportion to
    demand x deficit: the models furthest from their targets get the most)."""
    reserved_cores: Annotated[float, Field(ge=0)] = 0.0
    """ROMA's GC: cores kept to feed the GPUs; under node.cpu_cores."""
    actuator: Actuator = "auto"
    cfs_period_us: Annotated[int, Field(ge=1000, le=1_000_000)] = 10_000
    """The CFS period of cgroup quotas, in the kernel's range; a grant whose quota would be under
    the kernel's 1 ms gets 1 ms over a longer period, up to 100 ms (executors/limits.py)."""


def host_port(value: str) -> str:
    """ "HOST:PORT", the host a name, an IPv4 address or a bracketed IPv6 one."""
    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT, such as 0.0.0.0:7070 or [::1]:7070, got {value!r}")
    return value


# The JSON Schema says what host_port checks (a port's range aside), so that an editor refuses
# what the loader would.
HostPort = Annotated[str, AfterValidator(host_port), Field(json_schema_extra={"pattern": r"^.+:[0-9]{1,5}$"})]
# A worker token shorter than this is guessable (it guards every executor of the node).
MIN_WORKER_TOKEN = 16
DEFAULT_WORKER_PORT = 7070


@with_config(TABLE)
@dataclass(frozen=True)
class WorkerConfig:
    """[worker]: ``gateway worker``, one node of a cluster (ROMA Section 2.2): its executors, its
    controllers and supervisor, serving the executor protocol to dispatchers over TCP."""

    listen: HostPort = f"0.0.0.0:{DEFAULT_WORKER_PORT}"
    """Where dispatchers connect (the executor protocol over TCP)."""
    http_port: Annotated[int, Field(ge=0, le=65535)] = 8081
    """Health (/v2/health/live, /v2/health/ready), the node's state (/v2/worker) and /metrics,
    on the listen host; 0: none."""
    token: str | None = None
    """The secret every dispatcher must present (at least 16 characters); GATEWAY_WORKER_TOKEN wins."""
    name: str | None = None
    """How dispatchers name this node (default: the host name)."""
    tls_cert: Path | None = None
    """A PEM certificate (chain) for the executor protocol: set with tls_key, dispatchers must
    speak TLS to this worker and check the certificate against their cluster.tls_ca. Relative
    to the config file."""
    tls_key: Path | None = None
    """The PEM private key of tls_cert."""


@with_config(TABLE)
@dataclass(frozen=True)
class ClusterConfig:
    """[cluster]: ``gateway serve`` as a dispatcher of worker nodes (ROMA Sections 2.1-2.2)."""

    workers: str | tuple[HostPort, ...]
    """A list of "HOST:PORT", or "dns:NAME:PORT": a headless Service, resolved every
    resolve_interval_s (workers that appear are used, workers that vanish are drained)."""
    token: str | None = None
    """The workers' shared secret; GATEWAY_WORKER_TOKEN wins."""
    dns_server: HostPort | None = None
    """Ask this DNS server ("IP:PORT") rather than the system's resolver."""
    resolve_interval_s: PositiveFloat = 5.0
    """How often a dns: name is resolved again (a headless Service's records live 5-30 s)."""
    placement: Literal["balance", "pack"] = "balance"
    """Where replicas go (ROMA Section 2.2): balance (the workers holding the fewest replicas
    first) or pack (fill the workers holding the most first); one replica of a model per worker."""
    heartbeat_timeout_s: PositiveFloat = 3.0
    """A worker heard from not at all this long is taken as cut off (it reports every period)."""
    start_timeout_s: PositiveFloat = 60.0
    """How long ``gateway serve`` waits at start for a worker to serve every model."""
    name: str | None = None
    """How the workers name this dispatcher (default: host name and process id)."""
    tls_ca: Path | None = None
    """PEM CA certificates: set, every worker is reached over TLS and its certificate must chain
    to one of them and name the worker's host or address. Relative to the config file."""


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"must be an http:// or https:// URL, such as http://otel-collector:4318/v1/traces, got {value!r}")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url), Field(json_schema_extra={"pattern": "^https?://[^/?#]"})]


@with_config(TABLE)
@dataclass(frozen=True)
class TracingConfig:
    """[tracing]: OpenTelemetry spans of every infer request (receive, queue, dispatch, execute,
    reply), sent with OTLP over HTTP; needs the tracing extra (pip install 'sla-gateway[tracing]')."""

    enabled: bool = False
    otlp_endpoint: HttpUrl | None = None
    """Where spans are sent (OTLP/HTTP), such as http://otel-collector:4318/v1/traces (default:
    the environment's OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else
    http://localhost:4318/v1/traces)."""
    service_name: Annotated[str, Field(min_length=1)] = "sla-gateway"
    """The service.name of the spans."""
    sample_ratio: Share = 1.0
    """Share of the traces begun here that are recorded; a request that carries a traceparent
    follows its caller's decision."""


@with_config(TABLE)
@dataclass(frozen=True)
class PlantConfig:
    """[models.NAME.plant]: ROMA equations (8)-(12), the model's PI controller (controllers/pi.py)."""

    gain: PositiveFloat = DEFAULT_GAIN
    """k: change of the normalized speed alpha SLA / RT per core (positive: more cores raise the speed)."""
    zero: float = DEFAULT_ZERO
    """b: the plant's zero."""
    pole: Annotated[float, Field(ge=0, lt=1)] = DEFAULT_POLE
    """q: where the closed loop's double pole goes, in [0, 1)."""


@with_config(TABLE)
@dataclass(frozen=True)
class CpuTable:
    """[models.NAME.cpu]: the model's CPU executor."""

    cores: PositiveFloat | None = None
    """At start, and for ever under the fixed policy (default: node.cpu_cores shared evenly)."""
    threads: Annotated[int, Field(gt=0, le=MAX_THREADS)] | None = None
    """Intra-op threads (default: enough for max(cores, max_cores))."""
    min_cores: PositiveFloat = DEFAULT_MIN_CORES
    max_cores: PositiveFloat | None = None
    """Default: node.cpu_cores."""
    memory_mb: PositiveFloat | None = None
    """The executor's memory limit; over it, it is killed and replaced."""


@dataclass(frozen=True)
class CpuExecutorConfig:
    """[models.NAME.cpu] as the gateway runs it: every default worked out."""

    cores: float  # at start, and for ever under the "fixed" policy
    threads: int
    min_cores: float
    max_cores: float
    memory_mb: float | None = None  # the executor's memory limit; over it, it is killed and replaced


@with_config(TABLE)
@dataclass(frozen=True)
class ModelTable:
    """[models.NAME]: one ONNX model and its SLA."""

    path: Path
    """The ONNX file, relative to the config file; under server.model_dir."""
    sla_ms: PositiveFloat
    """Response-time SLA."""
    sla_measure: SlaMeasureName = "mean"
    """What must stay within sla_ms: mean (ROMA: a control window's mean), percentile (a
    window's sla_percentile-th percentile) or deadline (every request)."""
    sla_percentile: Annotated[float, Field(gt=0, lt=100)] = 99.0
    """The percentile measure's p."""
    max_batch_size: PositiveInt = DEFAULT_MAX_BATCH_SIZE
    cpu_executor: bool = True
    """false: served on the node's GPUs only (Triton's instance_group kind GPU), with no CPU
    executor, no [models.NAME.cpu] and no share of node.cpu_cores; needs node.gpus."""
    cpu: CpuTable = field(default_factory=CpuTable)
    plant: PlantConfig = field(default_factory=PlantConfig)
    drop_late: bool = False
    """Clockwork's admission control: refuse what cannot meet its deadline (else serve it late)."""
    gpu_profile: str | None = None
    """The row of gpu.profile that an emulated GPU uses for this model (default: its name)."""
    max_queue_size: PositiveInt = DEFAULT_MAX_QUEUE_SIZE
    """Triton's queue policy: requests beyond this many waiting are refused at once (429)."""
    hang_timeout_ms: PositiveFloat | None = None
    """A batch with no reply within this long means a hung executor: it is killed and replaced
    (default: 10 SLAs, at least 2 s)."""
    replicas: PositiveInt | None = None
    """With [cluster]: how many workers run the model's CPU executor (default: every worker);
    the admin API changes it at run time."""
    dispatch_batch: PositiveInt = 1
    """A planned CPU batch size (Harpagon's batch-aware dispatch): a free CPU executor waits until
    this many rows are queued, or until the head request must start to meet its SLA; 1: at once.
    ``gateway plan --apply`` sets it."""
    priority_levels: PositiveInt = 1
    """Triton's priority levels: a request's ``priority`` parameter from 1 (the highest) to
    this; 1: every request equal, the queue FIFO."""
    default_priority: PositiveInt | None = None
    """The level of a request that names none, or priority 0 (default: the lowest level)."""
    priority_bound_ms: PositiveFloat | None = None
    """A request that has waited this long is passed by no later request of a higher level
    (default: twice sla_ms), so that lower levels are not starved."""


@dataclass(frozen=True)
class ModelConfig:
    """[models.NAME] as the gateway runs it: named, its path resolved, its cores worked out."""

    name: str
    path: Path
    sla_ms: float
    max_batch_size: int
    cpu: CpuExecutorConfig | None  # None: no CPU executor (cpu_executor = false), the GPUs serve it alone
    plant: PlantConfig
    drop_late: bool = False
    gpu_profile: str | None = None
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    hang_timeout_ms: float | None = None
    sla_measure: str = "mean"
    sla_percentile: float = 99.0
    replicas: int | None = None
    dispatch_batch: int = 1
    priority_levels: int = 1
    default_priority: int | None = None
    priority_bound_ms: float | None = None

    @property
    def default_level(self) -> int:
        return self.default_priority or self.priority_levels

    @property
    def priority_bound(self) -> float:
        """ms a waiting request may be passed by higher levels (priority_bound_ms, else 2 SLAs)."""
        return self.priority_bound_ms or 2 * self.sla_ms

    @property
    def measure(self) -> SlaMeasure:
        return SlaMeasure(self.sla_measure, self.sla_percentile)  # type: ignore[arg-type]

    @property
    def hang_timeout_s(self) -> float:
        return (self.hang_timeout_ms or max(MIN_HANG_TIMEOUT_MS, HANG_TIMEOUT_SLAS * self.sla_ms)) / 1000


STEP_NAME_PATTERN = r"^[A-Za-z_][\w-]*$"
StepName = Annotated[str, Field(pattern=STEP_NAME_PATTERN)]
# A tensor of a pipeline: "request/NAME" (the pipeline's input NAME) or "STEP/NAME" (the output
# NAME of step STEP); tensor names may themselves hold '/', so the step is what precedes the first.
TensorSource = Annotated[str, Field(pattern=r"^[A-Za-z_][\w-]*/.+$")]
PIPELINE_INPUT = "request"


@with_config(TABLE)
@dataclass(frozen=True)
class PipelineTensor:
    """A tensor the pipeline takes or gives, as a model's metadata declares it."""

    name: str
    datatype: Literal[
        "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"
    ]
    shape: tuple[Annotated[int, Field(ge=-1)], ...]
    """Its dimensions, -1 where free."""
    source: TensorSource | None = None
    """For an output: the step's tensor it is ("STEP/NAME")."""


@with_config(TABLE)
@dataclass(frozen=True)
class PipelineStep:
    """One step of a pipeline: a served model, or a Python function of numpy arrays."""

    name: StepName
    inputs: dict[str, TensorSource]
    """The step's input name -> where it comes from: "request/NAME" or "STEP/NAME"."""
    model: ModelName | None = None
    """A model of [models]: the step runs through its queue and schedulers like any request."""
    function: str | None = None
    """"FILE.py:NAME": a function taking and returning a dict of numpy arrays (FILE relative to the
    config file); it runs in the gateway's process, off the event loop."""
    outputs: tuple[str, ...] = ()
    """A function's outputs (a model's come from the model)."""


@with_config(TABLE)
@dataclass(frozen=True)
class PipelinePath:
    """An SLA for one path of the DAG (FA2 Section IV): its steps in order."""

    steps: tuple[StepName, ...]
    sla_ms: PositiveFloat


@with_config(TABLE)
@dataclass(frozen=True)
class PipelineTable:
    """[pipelines.NAME]: a DAG of steps served as one model over KServe v2 (Harpagon, FA2)."""

    sla_ms: PositiveFloat
    """The end-to-end response-time target."""
    inputs: Annotated[tuple[PipelineTensor, ...], Field(min_length=1)]
    outputs: Annotated[tuple[PipelineTensor, ...], Field(min_length=1)]
    steps: Annotated[tuple[PipelineStep, ...], Field(min_length=1)]
    paths: tuple[PipelinePath, ...] = ()
    """Per-path SLAs where the DAG has several paths (default: every path has sla_ms)."""


@with_config(TABLE)
@dataclass(frozen=True, kw_only=True)
class ConfigFile:
    """A ``gateway serve`` config file (TOML). Its problems are reported in this order."""

    server: ServerConfig = field(default_factory=ServerConfig)
    node: NodeConfig = field(default_factory=NodeConfig)
    gpu: GpuTable = field(default_factory=GpuTable)
    docker: DockerConfig = field(default_factory=DockerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    cluster: ClusterConfig | None = None
    tracing: TracingConfig = field(default_factory=TracingConfig)
    models: Annotated[dict[ModelName, ModelTable], Field(min_length=1)]
    """At least one model, as a [models.NAME] table; NAME holds letters, digits, '_', '-' and '.'."""
    pipelines: dict[ModelName, PipelineTable] = field(default_factory=dict)
    """Pipelines of the models, each served as a model of its own name."""


@dataclass(frozen=True)
class GatewayConfig:
    """A config file as the gateway runs it (``loading.load_config``)."""

    source: Path
    server: ServerConfig
    node: NodeConfig
    policy: PolicyConfig
    control: ControlConfig = field(default_factory=ControlConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    docker: DockerConfig = field(default_factory=DockerConfig)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    cluster: ClusterConfig | None = None
    pipelines: dict[str, PipelineTable] = field(default_factory=dict)
    tracing: TracingConfig = field(default_factory=TracingConfig)


def default_threads(cores: float, max_cores: float) -> int:
    """One intra-op thread per core the executor may ever get, at most ``MAX_THREADS`` (node.cpu_cores
    = 300 gave every executor 300 threads, past the cap a config's own ``threads`` is held to)."""
    return min(MAX_THREADS, max(1, math.ceil(max(cores, max_cores))))
