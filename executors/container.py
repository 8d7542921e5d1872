"""Docker executors: each one a container running ``executors.worker`` (ROMA Section 2.2).

One container per model for CPU work and one per GPU holding every model, as ROMA deploys
them. The container speaks the same executor protocol as a process executor, over a Unix
socket in a directory bind-mounted into it; the model files are mounted read-only at the
paths the config names. The supervisor's cores are applied to the running container with
``container.update(cpu_quota, cpu_period)``, the same CFS quota the process executors get.

Two kinds of image:

- The *host-runtime* image (the default, ``sla-gateway-executor:host``): a root of a few empty
  directories made with ``docker import`` (``gateway docker-image``, or at start when it is
  missing), run with this host's ``/usr``, Python installation, virtual environment and
  checkout bind-mounted read-only and ``--network host``. It needs no registry, and the worker
  runs exactly the code and packages the gateway runs.
- A self-contained image built from ``executors/Dockerfile`` for production
  (``[docker] host_runtime = false``): its own Python and packages; only the model files and
  the socket directory are mounted.

Containers carry labels naming the gateway process that owns them. They are removed on
shutdown, and at start the containers of a gateway process that is no longer alive (a crashed
run) are removed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import io
import itertools
import logging
import socket
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
import requests
from docker.models.containers import Container

from executors.lifecycle import ExecutorStartError, SupervisedExecutor
from executors.limits import CFS_PERIOD_US, cfs_bandwidth, gateway_ended, owner_tag, quota_cores
from executors.names import safe_name
from executors.process import LONGEST_LINE_BYTES

log = logging.getLogger("executors")
# How long an exited container's output may take to reach the gateway before it says how it ended.
RELAY_JOIN_S = 2.0
# Threads for the Docker SDK's short blocking calls, and connections kept open to the daemon. A
# container's wait, which blocks for its whole life, has a thread of its own (``wait_apart``):
# in the pool, 64 containers' waits held every thread, and the 64th executor's next call
# queued for ever (a gateway of 64 Docker models never became ready, and said nothing).
POOL_THREADS = 64

HOST_RUNTIME_IMAGE = "sla-gateway-executor:host"
LABEL = "sla-gateway.executor"
OWNER_LABEL = "sla-gateway.owner"  # hostname:pid of the gateway that started the container
_PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Container paths of the production image (executors/Dockerfile).
IMAGE_MODELS_DIR = "/models"
IMAGE_SOCKET_DIR = "/run/gateway"


class DockerUnavailable(ExecutorStartError):
    """The Docker daemon cannot be reached, or cannot run what the config asks for."""


def _said(raw: bytes) -> str:
    """A line a container printed, as the log takes it: cut as a process executor's is
    (executors/process.py), where ONNX Runtime's words on a client's input ran to 80 kB."""
    text = raw[:LONGEST_LINE_BYTES].decode(errors="replace").rstrip()
    return text if len(raw) <= LONGEST_LINE_BYTES else f"{text} ... (cut: the line goes on past {len(raw)} bytes)"


def _owner() -> str:
    # The pid with its PID namespace where the gateway has one of its own (executors/limits.py's
    # owner_tag): two gateways, each pid 1 of a namespace, gave their containers one name.
    return f"{socket.gethostname()}:{owner_tag()}"


def minimal_root() -> bytes:
    """A tar of the directories an executor needs to exist before the host's are mounted over them."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, mode in (("usr", 0o755), ("etc", 0o755), ("tmp", 0o1777), ("proc", 0o555), ("sys", 0o555),
                           ("dev", 0o755), ("run", 0o755), ("root", 0o700), ("var", 0o755)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        # Debian's merged /usr: the loader and the shell are reached through these links.
        for link in ("bin", "sbin", "lib", "lib64"):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{link}"
            tar.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class DockerBackend:
    """The connection to the Docker daemon shared by every Docker executor of one gateway."""

    def __init__(self, image: str = HOST_RUNTIME_IMAGE, host_runtime: bool = True):
        self.image, self.host_runtime = image, host_runtime
        self.owner = _owner()
        self.client: docker.DockerClient | None = None
        self.nvidia = False
        # The SDK's calls block: they run in threads, not on the event loop.
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="docker")
        # Quota updates, one at a time in the order asked: the control loop lowers grants before
        # it raises others, and updates run side by side landed in any order (2.8 cores of quota
        # on a node of 2 while a raise was carried out before another container's lowering).
        self.quota_updates = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="docker-quota")

    def connect(self) -> None:
        """Reach the daemon, make sure the image exists, and remove a crashed run's containers."""
        try:
            # Each container holds two of the daemon's connections for its life (its wait and its
            # log stream): keep as many as the pool has threads, not the SDK's 10.
            self.client = docker.from_env(timeout=30, max_pool_size=POOL_THREADS)
            self.client.ping()
            info = self.client.info()
        except docker.errors.DockerException as error:
            raise DockerUnavailable(
                f"executor_backend is 'docker' but the Docker daemon cannot be reached ({error}). Start it (as root: "
                "`dockerd --iptables=false --bridge=none --storage-driver=vfs &`, or `systemctl start docker`), "
                'point DOCKER_HOST at it, or set executor_backend = "process".'
            ) from None
        self.nvidia = "nvidia" in info.get("Runtimes", {})
        try:
            self.client.images.get(self.image)
        except (docker.errors.NullResource, docker.errors.InvalidRepository) as error:
            raise DockerUnavailable(f"[docker] image {self.image!r} is no image name: {error}") from None
        except docker.errors.APIError as error:
            if error.status_code != 404:  # the daemon's "invalid reference format", say
                raise DockerUnavailable(f"[docker] image {self.image!r}: {error.explanation or error}") from None
            if not self.host_runtime:
                raise DockerUnavailable(
                    f"the executor image {self.image!r} is not on this Docker daemon: build it with "
                    f"`docker build -f executors/Dockerfile -t {self.image} .`, or use the host-runtime image "
                    "([docker] host_runtime = true)"
                ) from None
            import_host_image(self.client, self.image)
        self.remove_leftovers()

    def remove_leftovers(self) -> list[str]:
        """Remove the executor containers of gateway processes on this host that are gone."""
        assert self.client is not None
        host = socket.gethostname()
        removed = []
        # The SDK inspects each container it listed: one removed in between (a gateway stopping
        # its executors as another starts) is skipped, not a NotFound out of the whole start.
        listed = self.client.containers.list(all=True, filters={"label": OWNER_LABEL}, ignore_removed=True)
        for container in listed:
            owner_host, _, owner = container.labels.get(OWNER_LABEL, "").rpartition(":")
            # Not where the owner's pid is another PID namespace's (gateway_ended): a gateway in a
            # namespace of its own took a running host gateway's containers for an ended one's,
            # and removed them.
            if owner_host != host or not gateway_ended(owner):
                continue
            log.warning("removing container %s of a gateway that is gone (%s)", container.name, container.labels[OWNER_LABEL])
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                continue
            removed.append(container.name)
        return removed

    def close(self) -> None:
        # Waits for the calls under way (each within the client's 30 s timeout): a container the
        # daemon is still making would otherwise be left behind by a process that exits meanwhile.
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.quota_updates.shutdown(wait=True, cancel_futures=True)
        if self.client is not None:
            self.client.close()

    async def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: function(*args, **kwargs))

    @staticmethod
    async def wait_apart(function: Any, *args: Any, **kwargs: Any) -> Any:
        """A call that blocks for as long as a container lives, in a thread of its own."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(result)

        def run() -> None:
            try:
                result, error = function(*args, **kwargs), None
            except BaseException as raised:  # handed to the awaiting coroutine, as run_in_executor does
                result, error = None, raised
            with contextlib.suppress(RuntimeError):  # the event loop closed first: no one waits
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=run, name="docker-wait", daemon=True).start()
        return await future


def import_host_image(client: docker.DockerClient, tag: str = HOST_RUNTIME_IMAGE) -> None:
    """Make the host-runtime image with ``docker import`` (no registry needed)."""
    repository, _, version = tag.partition(":")
    client.api.import_image_from_data(minimal_root(), repository=repository, tag=version or "latest")
    log.info("imported the host-runtime executor image %s", tag)


# What the Docker SDK raises when the daemon answers with an error, and when it cannot be reached
# at all (a daemon restarting: requests' ConnectionError, no DockerException).
DAEMON_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)
# How long a removal already under way is waited for.
REMOVAL_WAIT_S = 30
_INSTANCES = itertools.count(1)


class DockerExecutor(SupervisedExecutor):
    backend = "docker"

    def __init__(self, *args: Any, docker_backend: DockerBackend, cfs_period_us: int = CFS_PERIOD_US, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.docker = docker_backend
        self.cfs_period_us = cfs_period_us
        self.container: Container | None = None
        self._launched: Container | None = None  # the last container made, once the daemon has made it
        self._launches = 0
        # Its containers' names are its own: a reloaded model's executor is another object, and
        # a name counted from 1 again met its predecessor's container while Docker removed it.
        self._instance = next(_INSTANCES)
        self._relay: threading.Thread | None = None  # follows the container's output

    # -- launching --------------------------------------------------------------------------
    @property
    def _socket_dir_inside(self) -> Path:
        """Where the container sees the socket directory: the same path, or the image's."""
        return self.socket_path.parent if self.docker.host_runtime else Path(IMAGE_SOCKET_DIR)

    def _mounts(self) -> tuple[list[docker.types.Mount], dict[str, Path]]:
        """Bind mounts, and where each model file is seen inside the container. Mounts, not
        volumes: for a source that is missing (a model file deleted, then its container
        restarted) the daemon makes a directory of a volume's, owned by root, which the model
        file put back then went into; a mount's is refused, and the restart is tried again."""
        # Path inside -> (host path, read-only): keyed by where it is seen, since two models may
        # name one file, each seen at a path of its own in a self-contained image.
        targets: dict[str, tuple[str, bool]] = {}
        if self.docker.host_runtime:
            for path in {"/usr", sys.base_prefix, sys.prefix, str(_PROJECT_ROOT), "/etc/ld.so.cache"}:
                targets[path] = (path, True)
            inside = {name: path.resolve() for name, path in self.models.items()}
        else:
            inside = {name: Path(IMAGE_MODELS_DIR) / f"{name}.onnx" for name in self.models}
        for name, path in self.models.items():
            targets[str(inside[name])] = (str(path.resolve()), True)
        targets[str(self._socket_dir_inside)] = (str(self.socket_path.parent), False)
        mounts = [
            docker.types.Mount(target, source, type="bind", read_only=read_only)
            for target, (source, read_only) in targets.items()
        ]
        return mounts, inside

    def _command(self, inside: dict[str, Path]) -> list[str]:
        arguments = self.worker_arguments(f"unix:{self._socket_dir_inside / self.socket_path.name}", inside)
        python = sys.executable if self.docker.host_runtime else "python"
        return [python, *arguments]

    async def _launch(self) -> Container:
        assert self.docker.client is not None
        mounts, inside = self._mounts()
        self._launches += 1
        options: dict[str, Any] = {
            "command": self._command(inside),
            "name": f"sla-gw-{owner_tag()}-{safe_name(self.id)}-{self._instance}-{self._launches}",
            "labels": {LABEL: self.id, OWNER_LABEL: self.docker.owner},
            "mounts": mounts,
            "network_mode": "host",
            "detach": True,
        }
        if self.docker.host_runtime:
            options |= {"environment": {"PYTHONPATH": str(_PROJECT_ROOT), "PYTHONUNBUFFERED": "1", "HOME": "/tmp"}}
            options |= {"working_dir": "/tmp"}
        if self.memory_mb is not None:
            # In bytes, as the process backend counts it: "0m" (memory_mb 0.5) was no limit at
            # all to Docker, and 100.9 MB was 100. Under Docker's least (6 MB), the daemon refuses it.
            limit = int(self.memory_mb * 2**20)
            options |= {"mem_limit": limit, "memswap_limit": limit}
        if self._capped:
            quota, self._enforced = self._quota(self.cores)
            options |= quota
        elif not self.emulate:
            if not self.docker.nvidia:
                raise DockerUnavailable(
                    f"executor {self.id} needs {self.device} in a container, but this Docker daemon has no NVIDIA "
                    'runtime (install the NVIDIA Container Toolkit), or use executor_backend = "process"'
                )
            device_id = self.device.partition(":")[2] or "0"
            options["device_requests"] = [docker.types.DeviceRequest(device_ids=[device_id], capabilities=[["gpu"]])]
        container = await self.docker.call(self._run_unless_stopped, options)
        self.container = container
        self._relay = threading.Thread(
            target=self._relay_output, args=(container, asyncio.get_running_loop()), name=f"logs-{self.id}", daemon=True
        )
        self._relay.start()
        log.info("executor %s: started container %s (%s) for %s on %s", self.id, container.name,
                 container.short_id, ", ".join(self.models), self.device)  # fmt: skip
        return container

    def _run_unless_stopped(self, options: dict[str, Any]) -> Container:
        """Create the container and start it, in the pool's thread. A stop() meanwhile cancels the
        coroutine that waits for it, not the thread: the container made is removed here when the
        stop came before it was, or by stop() (``_launched``) when it came after. One that is
        made but does not start (no python in the image, say) is removed here too, where
        ``containers.run`` left it behind, "created"."""
        assert self.docker.client is not None
        container = self._launched = self.docker.client.containers.create(self.docker.image, **options)
        try:
            # Cores set from now on update this container, in order with every other update
            # (``_actuate``); those set while it was made, before it starts. Started on the cores
            # it was made with, it held them for 50-75 ms beside the grant another model was
            # given meanwhile (3.3 cores of quota on a node of 2).
            self._contained = not self._stopping
            if self._capped and self._enforced is not None and self._enforced[0] != (cores := self.cores):
                quota, enforced = self._quota(cores)
                container.update(**quota)
                self._enforced = enforced
            container.start()
        except BaseException:
            self._contained = False
            with contextlib.suppress(*DAEMON_ERRORS):
                container.remove(force=True)
            raise
        if self._stopping:
            self._contained = False
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
            raise ExecutorStartError(f"executor {self.id} was stopped while its container was made")
        return container

    async def stop(self) -> None:
        await super().stop()
        if self._launched is not None:  # one whose launch the stop cut short is not its _handle
            await self._kill(self._launched)

    def _relay_output(self, container: Container, loop: asyncio.AbstractEventLoop) -> None:
        """Relay each line the container prints to the event loop (``_output_line``), as the
        process backend relays its pipe. In a thread of its own: the SDK's log stream blocks for
        the container's whole life (and has no read timeout, so a quiet spell does not end it)."""
        pending = b""
        try:
            for chunk in container.logs(stream=True, follow=True):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    loop.call_soon_threadsafe(self._output_line, _said(line))
            if pending:
                loop.call_soon_threadsafe(self._output_line, _said(pending))
        except RuntimeError:  # the event loop closed first: the gateway is gone
            pass
        except Exception as error:  # the container or the daemon went away: its output ends with it
            log.debug("executor %s: stopped following the container's output: %s", self.id, error)

    async def _wait_exit(self, handle: Container) -> str:
        try:
            status = await self.docker.wait_apart(handle.wait)
        except docker.errors.NotFound:
            return "container removed"
        except DAEMON_ERRORS as error:
            return f"lost track of the container: {error}"
        # The stream ends with the container: its last lines are in output_tail before we say how it ended.
        if self._relay is not None:
            await self.docker.call(self._relay.join, RELAY_JOIN_S)
        code = status.get("StatusCode")
        try:
            await self.docker.call(handle.reload)
            if handle.attrs["State"].get("OOMKilled"):
                return f"killed by the kernel: out of memory (over its limit of {self.memory_mb:g} MB, memory_mb)"
        except DAEMON_ERRORS:
            pass
        return "killed (exit code 137)" if code == 137 else f"exited with code {code}"

    async def _kill(self, handle: Container) -> None:
        """The container removed, whoever began it; a daemon out of reach is logged, not raised
        (it ended its containers as it went, and what it kept the next gateway removes)."""
        try:
            await self.docker.call(handle.remove, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise
            # Its removal was already under way: returning now, a stop left the container
            # behind for a moment, long enough for a reload's container to find its name taken.
            with contextlib.suppress(docker.errors.NotFound, *DAEMON_ERRORS):
                await self.docker.call(handle.wait, condition="removed", timeout=REMOVAL_WAIT_S)
        except requests.exceptions.RequestException as error:
            log.error("executor %s: container %s not removed, the Docker daemon is out of reach: %s", self.id, handle.name, error)

    # -- once it is up ----------------------------------------------------------------------
    async def _on_ready(self) -> None:
        """The worker's pid is its own namespace's; control and metrics want the host's."""
        assert self.container is not None
        await self.docker.call(self.container.reload)
        self.pid = self.container.attrs["State"]["Pid"] or None

    @property
    def _capped(self) -> bool:
        """Whether its container runs under a CPU quota: a CPU executor's, and a GPU executor's
        where the node reserves cores for the GPUs (``reserved_cores``, ROMA's GC), as a process
        executor's group (its container had none, and could use every core of the node)."""
        return self.device == "cpu" or self.cores > 0

    def _would_enforce(self, cores: float) -> float:
        """Docker's CFS quota has the kernel's 1 ms floor; an uncapped GPU executor's CPU is its own."""
        return quota_cores(cores, self.cfs_period_us) if self._capped else cores

    def _actuate(self) -> None:
        """Update the container's CFS quota to the cores asked for now, after every update asked
        for before, of any container of the gateway (``DockerBackend.quota_updates``)."""
        # The container of this run from when it is made (``_launched``), before it starts.
        if not self._capped or self._launched is None:
            return
        cores, container = self.cores, self._launched
        quota, enforced = self._quota(cores)
        done = asyncio.get_running_loop().run_in_executor(self.docker.quota_updates, functools.partial(container.update, **quota))
        done.add_done_callback(functools.partial(self._quota_updated, enforced, container))

    def _quota(self, cores: float) -> tuple[dict[str, int], tuple[float, float]]:
        """Docker's options for a CFS quota of ``cores``, and (``cores``, the cores it enforces)."""
        quota, period = cfs_bandwidth(cores, self.cfs_period_us)
        return {"cpu_period": period, "cpu_quota": quota}, (cores, quota / period)

    def _quota_updated(self, enforced: tuple[float, float], container: Container, done: asyncio.Future[Any]) -> None:
        error = None if done.cancelled() else done.exception()
        if error is not None:
            self._enforced = None
            log.error("executor %s: could not set %.2f cores on container %s: %s", self.id, enforced[0], container.name, error)
        elif not done.cancelled() and container is self._launched and enforced[0] == self.cores:
            self._enforced = enforced

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "actuator": "docker-cpu-quota" if self.device == "cpu" else None,
            "container": self.container.name if self.container is not None else None,
        }
