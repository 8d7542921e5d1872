"""The TOML configuration of ``gateway serve``.

Every error names the file, the key and what is wrong, and is raised before anything starts.
Unknown keys are errors too: a misspelt knob must not be silently ignored.
"""

from __future__ import annotations

import csv
import dataclasses
import ipaddress
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.pi import DEFAULT_GAIN, DEFAULT_POLE, DEFAULT_ZERO, pi_gains
from schedulers.gpu import POLICIES

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
DEFAULT_MAX_QUEUE_SIZE = 1024
# A batch that takes 10 SLAs (at least 2 s) is not slow, it is stuck.
HANG_TIMEOUT_SLAS = 10
MIN_HANG_TIMEOUT_MS = 2000.0


class ConfigError(ValueError):
    def __init__(self, source: Path | str, key: str, message: str):
        self.source, self.key = source, key
        super().__init__(f"{source}: {key}: {message}")


@dataclass(frozen=True)
class CpuExecutorConfig:
    cores: float  # at start, and for ever under the "fixed" policy
    threads: int
    min_cores: float
    max_cores: float
    memory_mb: float | None = None  # the executor's memory limit; over it, it is killed and replaced


@dataclass(frozen=True)
class PlantConfig:
    """ROMA equation (8)-(12) parameters of the model's PI controller (controllers/pi.py)."""

    gain: float  # k: change of the normalized speed alpha SLA / RT per core
    zero: float  # b: the plant's zero
    pole: float  # q: where the closed loop's double pole goes


@dataclass(frozen=True)
class ModelConfig:
    name: str
    path: Path
    sla_ms: float
    max_batch_size: int
    cpu: CpuExecutorConfig
    plant: PlantConfig
    # Clockwork's admission control: refuse what cannot meet its deadline (else serve it late).
    drop_late: bool = False
    # The row of [gpu].profile that an emulated GPU uses for this model.
    gpu_profile: str | None = None
    # Triton's queue policy: requests beyond this many waiting are refused at once (429).
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    # A batch with no reply within this long means a hung executor: it is killed and replaced.
    hang_timeout_ms: float | None = None

    @property
    def hang_timeout_s(self) -> float:
        return (self.hang_timeout_ms or max(MIN_HANG_TIMEOUT_MS, HANG_TIMEOUT_SLAS * self.sla_ms)) / 1000


GPU_EXECUTORS = ("cuda", "emulated")
GPU_POLICIES = POLICIES


@dataclass(frozen=True)
class GpuConfig:
    """GPU executors and their scheduler (ROMA Algorithm 1, Symphony Section 4.3)."""

    executor: str = "cuda"  # cuda (ONNX Runtime's CUDA provider) or emulated (held for l(b))
    policy: str = "deferral"
    queue_weight: float = 0.5  # ROMA's beta
    profile: Path | None = None  # CSV (model, alpha_ms, beta_ms): the emulated GPU's l(b)
    # How CPU executors share a queue with the GPUs: "spill" takes only what the GPUs' projected
    # capacity cannot finish in time; "greedy" takes anything (work-conserving, for comparison).
    cpu_sharing: str = "spill"
    # What an emulated GPU answers: "computed" (real outputs, computed on the CPU while the batch
    # is held for l(b)) or "zeros" (no computation: for benchmarks of scheduling only).
    emulated_outputs: str = "computed"
    profiles: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_elements: int = DEFAULT_MAX_ELEMENTS
    # Every request ends: a client's own timeout (the protocol's ``timeout`` parameter, in
    # microseconds as Triton reads it) is capped by this, which also applies when it gives none.
    request_timeout_ms: float = DEFAULT_REQUEST_TIMEOUT_MS
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S  # on SIGTERM/SIGINT, how long in-flight requests may finish
    admin_token: str | None = None  # GATEWAY_ADMIN_TOKEN wins
    data_token: str | None = None  # GATEWAY_DATA_TOKEN wins; none: the data plane is open
    model_dir: Path | None = None  # model files must lie under it (default: the config file's folder)


EXECUTOR_BACKENDS = ("process", "docker")


@dataclass(frozen=True)
class NodeConfig:
    cpu_cores: float
    gpus: tuple[int, ...] = ()  # device ids
    executor_backend: str = "process"  # process: OS processes; docker: one container each


@dataclass(frozen=True)
class DockerConfig:
    """The Docker executor backend (executors/container.py)."""

    image: str = "sla-gateway-executor:host"
    # Run the host's Python, packages and checkout, bind-mounted read-only into a minimal root
    # made with ``docker import``; false for a self-contained image from executors/Dockerfile.
    host_runtime: bool = True


@dataclass(frozen=True)
class PolicyConfig:
    cpu_scheduler: str = "round_robin"
    seed: int | None = None


CONTROL_POLICIES = ("fixed", "pi", "rules", "max", "min")
ACTUATORS = ("auto", "cgroup", "affinity")


@dataclass(frozen=True)
class ControlConfig:
    """The CPU control plane (ROMA Sections 3-5): which controller, how often, how arbitrated."""

    policy: str = "fixed"  # fixed (cores as configured), pi (ROMA's CT), rules, max, min
    period_s: float = 1.0  # ROMA's control period
    setpoint_ratio: float = 0.8  # ROMA's alpha: the set point is alpha x SLA
    spare_share: float = 0.0  # ROMA's gamma: share of the spare cores handed out
    reserved_cores: float = 0.0  # ROMA's GC: cores kept to feed the GPUs
    actuator: str = "auto"
    cfs_period_us: int = 10_000


@dataclass(frozen=True)
class GatewayConfig:
    source: Path
    server: ServerConfig
    node: NodeConfig
    policy: PolicyConfig
    control: ControlConfig = field(default_factory=ControlConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    docker: DockerConfig = field(default_factory=DockerConfig)
    models: dict[str, ModelConfig] = field(default_factory=dict)


class _Table:
    """A TOML table that remembers where it sits, so errors can name the full key."""

    def __init__(self, source: Path, prefix: str, data: Any):
        if not isinstance(data, dict):
            raise ConfigError(source, prefix or "(top level)", f"must be a table, got {type(data).__name__}")
        self.source, self.prefix, self.data = source, prefix, data
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        self.used.add(name)
        if name not in self.data:
            if default is ...:
                raise ConfigError(self.source, self.key(name), "is required")
            return default
        value = self.data[name]
        # TOML integers are fine where a float is asked for; booleans are never numbers.
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and kind is not bool:
            raise ConfigError(self.source, self.key(name), f"must be {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            raise ConfigError(self.source, self.key(name), f"must be {_kind_name(kind)}, got {type(value).__name__} {value!r}")
        return value

    def table(self, name: str) -> _Table:
        self.used.add(name)
        return _Table(self.source, self.key(name), self.data.get(name, {}))

    def positive(self, name: str, kind: type, default: Any = ...) -> Any:
        value = self.get(name, kind, default)
        if value is not None and (value <= 0 or (isinstance(value, float) and not math.isfinite(value))):
            raise ConfigError(self.source, self.key(name), f"must be a positive number, got {value!r}")
        return value

    def reject_unknown(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ConfigError(self.source, self.key(unknown[0]), f"unknown key (known: {', '.join(sorted(self.used))})")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", list: "a list", dict: "a table"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    source = Path(path)
    try:
        raw = tomllib.loads(source.read_text())
    except FileNotFoundError:
        raise ConfigError(source, "(file)", "no such file") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(source, "(syntax)", str(error)) from None
    root = _Table(source, "", raw)
    base = source.resolve().parent

    server_table = root.table("server")
    model_dir = server_table.get("model_dir", str, None)
    server = ServerConfig(
        host=server_table.get("host", str, DEFAULT_HOST),
        port=server_table.get("port", int, DEFAULT_PORT),
        max_body_bytes=server_table.positive("max_body_bytes", int, DEFAULT_MAX_BODY_BYTES),
        max_json_depth=server_table.positive("max_json_depth", int, DEFAULT_MAX_JSON_DEPTH),
        max_elements=server_table.positive("max_elements", int, DEFAULT_MAX_ELEMENTS),
        request_timeout_ms=server_table.positive("request_timeout_ms", float, DEFAULT_REQUEST_TIMEOUT_MS),
        drain_timeout_s=server_table.positive("drain_timeout_s", float, DEFAULT_DRAIN_TIMEOUT_S),
        admin_token=_token("GATEWAY_ADMIN_TOKEN", server_table.get("admin_token", str, None)),
        data_token=_token("GATEWAY_DATA_TOKEN", server_table.get("data_token", str, None)),
        model_dir=(base / model_dir).resolve() if model_dir else base.resolve(),
    )
    if not 0 <= server.port <= 65535:
        raise ConfigError(source, "server.port", f"must be 0-65535, got {server.port}")
    server_table.reject_unknown()

    node_table = root.table("node")
    node = NodeConfig(
        cpu_cores=node_table.positive("cpu_cores", float, float(os.cpu_count() or 1)),
        gpus=tuple(node_table.get("gpus", list, [])),
        executor_backend=node_table.get("executor_backend", str, "process"),
    )
    if node.executor_backend not in EXECUTOR_BACKENDS:
        raise ConfigError(
            source, "node.executor_backend", f"unknown backend {node.executor_backend!r} (known: {', '.join(EXECUTOR_BACKENDS)})"
        )
    if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in node.gpus) or len(set(node.gpus)) != len(
        node.gpus
    ):
        raise ConfigError(source, "node.gpus", f"must be a list of distinct GPU device ids such as [0, 1], got {list(node.gpus)}")
    node_table.reject_unknown()

    gpu_table = root.table("gpu")
    profile_path = gpu_table.get("profile", str, None)
    gpu = GpuConfig(
        executor=gpu_table.get("executor", str, "cuda"),
        policy=gpu_table.get("policy", str, "deferral"),
        queue_weight=gpu_table.get("queue_weight", float, 0.5),
        cpu_sharing=gpu_table.get("cpu_sharing", str, "spill"),
        emulated_outputs=gpu_table.get("emulated_outputs", str, "computed"),
        profile=(base / profile_path)
        if profile_path and not Path(profile_path).is_absolute()
        else (Path(profile_path) if profile_path else None),
    )
    if gpu.executor not in GPU_EXECUTORS:
        raise ConfigError(source, "gpu.executor", f"unknown executor {gpu.executor!r} (known: {', '.join(GPU_EXECUTORS)})")
    if gpu.policy not in GPU_POLICIES:
        raise ConfigError(source, "gpu.policy", f"unknown policy {gpu.policy!r} (known: {', '.join(GPU_POLICIES)})")
    if gpu.emulated_outputs not in ("computed", "zeros"):
        raise ConfigError(source, "gpu.emulated_outputs", f"must be computed or zeros, got {gpu.emulated_outputs!r}")
    if gpu.cpu_sharing not in ("spill", "greedy"):
        raise ConfigError(source, "gpu.cpu_sharing", f"must be spill or greedy, got {gpu.cpu_sharing!r}")
    if not 0 <= gpu.queue_weight <= 1:
        raise ConfigError(source, "gpu.queue_weight", f"must be between 0 and 1, got {gpu.queue_weight}")
    if gpu.executor == "emulated" and node.gpus:
        if gpu.profile is None:
            raise ConfigError(source, "gpu.profile", "an emulated GPU needs a profile CSV (model, alpha_ms, beta_ms)")
        gpu = dataclasses.replace(gpu, profiles=_read_profiles(source, gpu.profile))
    gpu_table.reject_unknown()

    docker_table = root.table("docker")
    docker = DockerConfig(
        image=docker_table.get("image", str, DockerConfig.image),
        host_runtime=docker_table.get("host_runtime", bool, DockerConfig.host_runtime),
    )
    docker_table.reject_unknown()

    policy_table = root.table("policy")
    policy = PolicyConfig(
        cpu_scheduler=policy_table.get("cpu_scheduler", str, "round_robin"),
        seed=policy_table.get("seed", int, None),
    )
    if policy.cpu_scheduler != "round_robin":
        raise ConfigError(source, "policy.cpu_scheduler", f"unknown scheduler {policy.cpu_scheduler!r} (known: round_robin)")
    policy_table.reject_unknown()

    control_table = root.table("control")
    control = ControlConfig(
        policy=control_table.get("policy", str, "fixed"),
        period_s=control_table.positive("period_s", float, 1.0),
        setpoint_ratio=control_table.positive("setpoint_ratio", float, 0.8),
        spare_share=control_table.get("spare_share", float, 0.0),
        reserved_cores=control_table.get("reserved_cores", float, 0.0),
        actuator=control_table.get("actuator", str, "auto"),
        cfs_period_us=control_table.positive("cfs_period_us", int, 10_000),
    )
    if control.policy not in CONTROL_POLICIES:
        raise ConfigError(source, "control.policy", f"unknown policy {control.policy!r} (known: {', '.join(CONTROL_POLICIES)})")
    if control.actuator not in ACTUATORS:
        raise ConfigError(source, "control.actuator", f"unknown actuator {control.actuator!r} (known: {', '.join(ACTUATORS)})")
    if not 0 <= control.spare_share <= 1:
        raise ConfigError(source, "control.spare_share", f"must be between 0 and 1, got {control.spare_share}")
    if not 0 < control.setpoint_ratio <= 1:
        raise ConfigError(source, "control.setpoint_ratio", f"must be in (0, 1], got {control.setpoint_ratio}")
    if not 0 <= control.reserved_cores < node.cpu_cores:
        raise ConfigError(
            source, "control.reserved_cores", f"must be at least 0 and under node.cpu_cores, got {control.reserved_cores}"
        )
    if not 1000 <= control.cfs_period_us <= 1_000_000:
        raise ConfigError(
            source, "control.cfs_period_us", f"must be 1000-1000000 (the kernel's range), got {control.cfs_period_us}"
        )
    control_table.reject_unknown()

    models_table = root.table("models")
    if not models_table.data:
        raise ConfigError(source, "models", "at least one model is required, as a [models.NAME] table")
    default_cores = node.cpu_cores / len(models_table.data)
    models: dict[str, ModelConfig] = {}
    for name in models_table.data:
        table = models_table.table(name)
        if not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ConfigError(source, table.prefix, "a model name may hold letters, digits, '_', '-' and '.' only")
        model_path = Path(table.get("path", str))
        if not model_path.is_absolute():
            model_path = base / model_path
        assert server.model_dir is not None
        if not model_path.resolve().is_relative_to(server.model_dir):
            raise ConfigError(
                source, table.key("path"), f"{model_path} is outside the model directory {server.model_dir} (server.model_dir)"
            )
        if not model_path.is_file():
            raise ConfigError(source, table.key("path"), f"no ONNX file at {model_path}")
        cpu_table = table.table("cpu")
        cores = cpu_table.positive("cores", float, default_cores)
        max_cores = cpu_table.positive("max_cores", float, node.cpu_cores)
        cpu = CpuExecutorConfig(
            cores=cores,
            threads=cpu_table.positive("threads", int, max(1, math.ceil(max(cores, max_cores)))),
            # ROMA's own controller clamps at 0.1 core: less leaves a model unable to answer at all.
            min_cores=cpu_table.positive("min_cores", float, 0.1),
            max_cores=max_cores,
            memory_mb=cpu_table.positive("memory_mb", float, None),
        )
        if not cpu.min_cores <= cpu.cores <= cpu.max_cores:
            raise ConfigError(
                source, cpu_table.key("cores"), f"must lie in [min_cores, max_cores] = [{cpu.min_cores}, {cpu.max_cores}]"
            )
        cpu_table.reject_unknown()
        plant_table = table.table("plant")
        plant = PlantConfig(
            gain=plant_table.get("gain", float, DEFAULT_GAIN),
            zero=plant_table.get("zero", float, DEFAULT_ZERO),
            pole=plant_table.get("pole", float, DEFAULT_POLE),
        )
        if plant.gain <= 0:
            raise ConfigError(source, plant_table.key("gain"), "must be positive: more cores raise the speed 1/RT")
        try:
            pi_gains(plant.gain, plant.zero, plant.pole)
        except ValueError as error:
            raise ConfigError(source, plant_table.prefix, str(error)) from None
        plant_table.reject_unknown()
        models[name] = ModelConfig(
            name=name,
            path=model_path,
            sla_ms=table.positive("sla_ms", float),
            max_batch_size=table.positive("max_batch_size", int, 32),
            cpu=cpu,
            plant=plant,
            drop_late=table.get("drop_late", bool, False),
            gpu_profile=table.get("gpu_profile", str, None),
            max_queue_size=table.positive("max_queue_size", int, DEFAULT_MAX_QUEUE_SIZE),
            hang_timeout_ms=table.positive("hang_timeout_ms", float, None),
        )
        if gpu.executor == "emulated" and node.gpus and (models[name].gpu_profile or name) not in gpu.profiles:
            raise ConfigError(
                source, table.key("gpu_profile"), f"{gpu.profile} has no row {models[name].gpu_profile or name!r} for this model"
            )
        table.reject_unknown()
    root.reject_unknown()
    return GatewayConfig(
        source=source, server=server, node=node, policy=policy, control=control, gpu=gpu, docker=docker, models=models
    )


def _token(variable: str, configured: str | None) -> str | None:
    """A token from the environment wins over the config's; an empty one is none."""
    return os.environ.get(variable) or configured or None


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
    try:
        with path.open() as handle:
            return {row["model"]: (float(row["alpha_ms"]), float(row["beta_ms"])) for row in csv.DictReader(handle)}
    except FileNotFoundError:
        raise ConfigError(source, "gpu.profile", f"no such file {path}") from None
    except (KeyError, ValueError) as error:
        raise ConfigError(source, "gpu.profile", f"{path} needs the columns model, alpha_ms, beta_ms: {error}") from None
