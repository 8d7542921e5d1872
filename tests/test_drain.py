"""A worker that leaves the DNS is drained (gateway/cluster/link.py): its link stays open until
every batch the dispatch core gave one of its executors has ended, including a batch whose
task has not reached the connection yet, which closing the link would fail with 503."""

from __future__ import annotations

import asyncio

from gateway.cluster.link import RemoteExecutor, WorkerLink
from tests.helpers import free_port


async def test_a_drain_waits_for_a_batch_given_but_not_yet_sent():
    changes: list[list[str]] = []
    link = WorkerLink(
        f"127.0.0.1:{free_port()}",  # nobody listens: the link keeps retrying until stopped
        "a-token-of-sixteen-chars",
        "dispatcher",
        heartbeat_timeout_s=1.0,
        on_change=lambda _link, executors: changes.append([e.id for e in executors]),
    )
    executor = RemoteExecutor(link, {"id": "cpu-0", "device": "cpu", "models": {"mlp": {}}})
    link.executors[executor.local_id] = executor
    link.start()
    given = {executor.id}  # the core's word: a batch on it has not ended
    drain = asyncio.create_task(link.drain(5.0, lambda executor_id: executor_id in given))

    await asyncio.sleep(0.3)
    assert link.draining and changes == [[executor.id]]  # no new batches for it
    assert not drain.done()  # the link is kept while the batch is out
    assert not link._task.done()

    given.clear()  # the batch ended
    await asyncio.wait_for(drain, 1.0)
    assert link._task.done()  # then the link is let go
