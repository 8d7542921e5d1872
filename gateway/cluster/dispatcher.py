"""The dispatcher's view of its cluster (ROMA Sections 2.1-2.2): which workers are up, which of
their executors it uses, and where each model's replicas are.

Workers come from ``[cluster] workers`` (a static list, or a headless Service's DNS name
resolved every few seconds: gateway/cluster/discovery.py). Each has a ``WorkerLink``; a worker
that vanishes from the DNS is drained (nothing new is sent; what is in flight ends) and let go.
Every worker's executors are handed to the engine once, as ``RemoteExecutor``s; the dispatch
core then sees every GPU of every worker and every CPU replica, and routes around those that
are not ready. Replicas (a model's CPU executors on distinct workers, at most one per worker)
are placed by ``schedulers/placement.py`` and placed again whenever a worker comes or goes or
the admin API changes a model's count.

Each dispatcher schedules its own traffic (Section 2.1); the workers it shares with others
control their cores from everything that reaches them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable

from gateway.cluster.discovery import Discovery, make_resolver, parse_workers
from gateway.cluster.link import RemoteExecutor, WorkerLink
from gateway.cluster.tls import client_context
from gateway.config import ClusterConfig, GatewayConfig
from schedulers.placement import place

log = logging.getLogger("gateway.cluster")

# A vanished worker's batches in flight get this long to end before its link is closed (they
# then fail 503): a batch runs for milliseconds to a few seconds.
DRAIN_TIMEOUT_S = 10.0


class Cluster:
    def __init__(
        self,
        config: GatewayConfig,
        *,
        on_executor: Callable[[RemoteExecutor], None],
        on_ready_change: Callable[[RemoteExecutor], None],
        has_batch: Callable[[str], bool] = lambda executor_id: False,
        on_executor_gone: Callable[[RemoteExecutor], None] = lambda executor: None,
        signature_differs: Callable[[RemoteExecutor], str | None] = lambda executor: None,
    ):
        """``on_executor`` hears of each executor of a worker once, when first seen;
        ``on_executor_gone`` of each of a worker let go (drained, not back);
        ``on_ready_change`` whenever one may have become ready or stopped being so;
        ``has_batch(executor_id)``: whether the dispatch core has given it a batch not ended yet
        (a drain waits for those, sent or not)."""
        assert config.cluster is not None
        self.config: ClusterConfig = config.cluster
        self.token = self.config.token or ""
        self.tls = client_context(self.config.tls_ca) if self.config.tls_ca is not None else None
        self.name = self.config.name or f"{socket.gethostname()}-{os.getpid()}"
        self.on_executor, self.on_ready_change = on_executor, on_ready_change
        self.has_batch = has_batch
        self.on_executor_gone = on_executor_gone
        self.signature_differs = signature_differs
        #: Replicas wanted per model with a CPU executor (None: one on every worker that holds it).
        self.replicas: dict[str, int | None] = {name: m.replicas for name, m in config.models.items() if m.cpu is not None}
        self.placed: dict[str, list[str]] = {name: [] for name in self.replicas}
        self.links: dict[str, WorkerLink] = {}
        # Every executor handed to the engine, by id: a worker back at its address while its old
        # link drains gets these objects again, bound to its new link (new objects of the same
        # ids would never reach the engine); a worker let go has its executors forgotten.
        self._handed: dict[str, RemoteExecutor] = {}
        self._drains: set[asyncio.Task[None]] = set()
        #: Each model's SLA, the config's until the admin API sets another: every hello carries
        #: them all, so that a worker holds no SLA that an earlier dispatcher (or an earlier run
        #: of this one) set and no connected dispatcher holds.
        self.sla_ms: dict[str, float] = {name: m.sla_ms for name, m in config.models.items()}
        workers = self.config.workers
        self.discovery = Discovery(
            parse_workers(workers if isinstance(workers, str) else list(workers)),
            make_resolver(self.config.dns_server),
            interval_s=self.config.resolve_interval_s,
            on_change=self._on_discovery,
        )

    async def start(self) -> None:
        await self.discovery.start()

    async def stop(self) -> None:
        await self.discovery.stop()
        for task in list(self._drains):
            task.cancel()
        await asyncio.gather(*(link.stop() for link in self.links.values()), return_exceptions=True)

    async def wait_until_serving(self, models: list[str], has_executor: Callable[[str], bool]) -> None:
        """Until every model in ``models`` has a ready executor (``has_executor``), at most
        ``start_timeout_s``; then raise ExecutorStartError naming the models still waiting."""
        from executors.lifecycle import ExecutorStartError

        deadline = time.perf_counter() + self.config.start_timeout_s
        while waiting := [m for m in models if not has_executor(m)]:
            if time.perf_counter() > deadline:
                states = {a: link.last_error or ("up" if link.connected else "connecting") for a, link in self.links.items()}
                raise ExecutorStartError(
                    f"no worker serves {', '.join(waiting)} after {self.config.start_timeout_s:g} s "
                    f"(cluster.start_timeout_s); workers: {states or 'none found at ' + str(self.discovery.source)}"
                )
            await asyncio.sleep(0.05)

    def set_replicas(self, model: str, replicas: int | None) -> None:
        self.replicas[model] = replicas
        self._place()

    def describe(self) -> dict[str, object]:
        return {
            "dispatcher": self.name,
            "workers_from": str(self.discovery.source),
            "placement": self.config.placement,
            "tls": self.tls is not None,
            "workers": [
                {
                    "address": address,
                    "name": link.worker_name,
                    "connected": link.connected,
                    "draining": link.draining,
                    "connects": link.connects,
                    "last_error": link.last_error,
                    "in_flight": link.in_flight,
                }
                for address, link in sorted(self.links.items())
            ],
            "replicas": {m: {"wanted": self.replicas[m], "placed": self.placed[m]} for m in self.replicas},
        }

    # -- workers coming and going -------------------------------------------------------------
    def _on_discovery(self, appeared: list[str], vanished: list[str]) -> None:
        for address in appeared:
            link = self.links.get(address)
            if link is not None and not link.draining:
                continue
            link = WorkerLink(
                address,
                self.token,
                self.name,
                heartbeat_timeout_s=self.config.heartbeat_timeout_s,
                on_change=self._on_link_change,
                tls=self.tls,
                sla_ms=lambda: dict(self.sla_ms),
            )
            # A worker back at its address while its old link drains serves through the
            # executors the engine already holds for it.
            self._adopt(address, link)
            self.links[address] = link
            link.start()
        for address in vanished:
            link = self.links.get(address)
            if link is not None and not link.draining:
                log.info("worker %s left the DNS: draining it", address)
                task = asyncio.create_task(self._drain(link))
                self._drains.add(task)
                task.add_done_callback(self._drains.discard)

    async def _drain(self, link: WorkerLink) -> None:
        await link.drain(DRAIN_TIMEOUT_S, self.has_batch)
        if self.links.get(link.address) is link:
            del self.links[link.address]
        # Its executors go too, unless the worker came back meanwhile (a new link adopted them):
        # kept, each address that ever came and went would leave its executors for good.
        for executor_id, executor in list(self._handed.items()):
            if executor.link is link:
                del self._handed[executor_id]
                self.on_executor_gone(executor)
        self._place()

    def set_sla(self, model: str, sla_ms: float) -> None:
        """A model's SLA set at run time: every worker's controller regulates to it (they kept
        the config's), now and on each later connect."""
        self.sla_ms[model] = sla_ms
        for link in self.links.values():
            link.send_sla(model, sla_ms)

    def _adopt(self, address: str, link: WorkerLink) -> None:
        """Bind the executors handed to the engine for ``address`` to its new ``link``: the
        engine routes through those objects, whatever link they were made by."""
        for executor in self._handed.values():
            if executor.link.address == address:
                executor.link = link
                # Ready again only once the worker's hello lists it: a worker that comes back
                # with another config may no longer run it.
                executor.worker_state = "new"
                link.executors[executor.local_id] = executor

    def _on_link_change(self, link: WorkerLink, executors: list[RemoteExecutor]) -> None:
        for executor in executors:
            self._check_signature(executor)
            if executor.id not in self._handed:
                self._handed[executor.id] = executor
                self.on_executor(executor)
        self._place(also=executors)

    def check_signatures(self) -> None:
        """Every executor against the models' signatures (once serving begins, they are known)."""
        for link in self.links.values():
            for executor in link.executors.values():
                if self._check_signature(executor):
                    self.on_ready_change(executor)

    def _check_signature(self, executor: RemoteExecutor) -> bool:
        """Refuse an executor whose model differs from the one served (a worker's config that
        points the name at another file, a rolling upgrade that changed the model), take it
        back once it matches; whether that changed."""
        differs = self.signature_differs(executor)
        refused = f"its model '{differs}' takes or gives other tensors than the one served" if differs else None
        if refused == executor.refused:
            return False
        executor.refused = refused
        if refused:
            log.error("executor %s is left out: %s", executor.id, refused)
        return True

    def _place(self, also: list[RemoteExecutor] = ()) -> None:  # type: ignore[assignment]
        """Place the replicas anew; tell the engine of every executor whose readiness may have changed."""
        up = sorted(address for address, link in self.links.items() if link.connected and not link.draining)
        holds = {
            address: {
                m
                for e in self.links[address].executors.values()
                if e.device == "cpu" and not (e.gone or e.refused)
                for m in e.models
            }
            for address in up
        }
        placed = place(self.replicas, up, holds, self.placed, self.config.placement)
        if placed != self.placed:
            log.info("replicas placed: %s", {m: w for m, w in placed.items()})
        self.placed = placed
        changed = {e.id: e for e in also}
        for address, link in self.links.items():
            for executor in link.executors.values():
                if executor.device != "cpu":
                    continue
                now_placed = any(address in placed.get(m, ()) for m in executor.models)
                if executor.placed != now_placed:
                    executor.placed = now_placed
                    changed[executor.id] = executor
        for executor in changed.values():
            self.on_ready_change(executor)
