"""The executors of one node, built from the config: one CPU executor per model, one GPU executor
per GPU holding every model (ROMA Section 2.2), and what enforces their cores.

``gateway serve`` builds them when it serves alone; ``gateway worker`` builds them on each node
of a cluster (gateway/cluster/worker.py). Both build them here, so that a model runs the same way
on either.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from executors.container import DockerBackend, DockerExecutor
from executors.lifecycle import SupervisedExecutor
from executors.limits import Actuator, make_actuator, sweep_ended_gateways
from executors.process import ProcessExecutor
from gateway.config import GatewayConfig
from gateway.config.schema import ModelConfig
from schedulers.dispatch import cpu_executor_id

log = logging.getLogger("gateway")


@dataclass
class NodeExecutors:
    actuator: Actuator | None  # process executors' cores: a cgroup quota (or affinity)
    docker: DockerBackend | None  # containers' cores: Docker's CPU quota
    cpu: dict[str, SupervisedExecutor] = field(default_factory=dict)  # model -> its CPU executor
    gpus: list[SupervisedExecutor] = field(default_factory=list)
    executor_class: Callable[..., SupervisedExecutor] = ProcessExecutor

    def cpu_executor(
        self,
        model: ModelConfig,
        socket_dir: Path,
        on_change: Callable[[str], None] = lambda executor_id: None,
        executor_id: str | None = None,
    ) -> SupervisedExecutor:
        """A model's CPU executor, not started (a model of the config, or one loaded at run time),
        its id ``cpu-NAME`` unless told another."""
        assert model.cpu is not None
        executor_id = executor_id or cpu_executor_id(model.name)
        return self.executor_class(
            executor_id,
            {model.name: model.path},
            device="cpu",
            threads=model.cpu.threads,
            cores=model.cpu.cores,
            memory_mb=model.cpu.memory_mb,
            socket_dir=socket_dir,
            actuator=self.actuator,
            on_change=functools.partial(on_change, executor_id),
        )

    @property
    def by_id(self) -> dict[str, SupervisedExecutor]:
        return {e.id: e for e in [*self.cpu.values(), *self.gpus]}

    @property
    def enforced_by(self) -> str:
        return self.actuator.name if self.actuator is not None else "docker-cpu-quota"

    def close(self) -> None:
        if self.docker is not None:
            self.docker.close()
        if self.actuator is not None:
            self.actuator.close()


def build_node_executors(
    config: GatewayConfig, socket_dir: Path, on_change: Callable[[str], None] = lambda executor_id: None
) -> NodeExecutors:
    """The node's executors, not started; ``on_change(id)`` hears of every change of state."""
    executor_class: Callable[..., SupervisedExecutor] = ProcessExecutor
    sweep_ended_gateways()
    node = NodeExecutors(actuator=None, docker=None)
    if config.node.executor_backend == "docker":
        node.docker = DockerBackend(config.docker.image, config.docker.host_runtime)
        executor_class = functools.partial(DockerExecutor, docker_backend=node.docker, cfs_period_us=config.control.cfs_period_us)
    else:
        node.actuator = make_actuator(config.control.actuator, config.control.cfs_period_us)
    node.executor_class = executor_class
    for name, model in config.models.items():
        if model.cpu is None:
            continue  # cpu_executor = false: the GPU executors alone serve it
        node.cpu[name] = node.cpu_executor(model, socket_dir, on_change)
    # ROMA's GC (Section 3, Algorithm 2): the cores the supervisor keeps from the models feed the
    # GPUs, so the GPU executors get them, shared evenly, as a quota of their own (a group per
    # executor id) that the models' executors cannot take. GC = 0: uncapped, as before.
    gpu = config.gpu
    reserved = config.control.reserved_cores
    gpu_cores = reserved / len(config.node.gpus) if reserved > 0 and config.node.gpus else 0.0
    largest_batches = {name: m.max_batch_size for name, m in config.models.items()}
    for device_id in config.node.gpus:
        emulated = gpu.executor == "emulated"
        emulate = {name: gpu.profiles[m.gpu_profile or name] for name, m in config.models.items()} if emulated else None
        node.gpus.append(
            executor_class(
                f"gpu-{device_id}",
                {name: m.path for name, m in config.models.items()},
                device=f"gpu:{device_id}",
                threads=1,
                cores=gpu_cores,
                actuator=node.actuator if gpu_cores > 0 else None,
                socket_dir=socket_dir,
                emulate=emulate,
                emulate_zeros=gpu.emulated_outputs == "zeros",
                on_change=functools.partial(on_change, f"gpu-{device_id}"),
                model_cache=gpu.memory_mb is not None,
                gpu_batches=None if emulated else largest_batches,
                warmup=gpu.warmup,
                fixed_batch_shapes=gpu.batch_shapes == "fixed",
                cudnn_conv_algo_search=gpu.cudnn_conv_algo_search.upper(),
            )
        )
    return node
