"""Process executors: each one an OS process on this host running ``executors.worker``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from executors.lifecycle import SupervisedExecutor
from executors.limits import ExecutorCgroup, Hierarchy
from executors.names import PARENT_PID_VARIABLE

log = logging.getLogger("executors")

# The project root, so that the worker imports this very checkout even when not installed.
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


class ProcessExecutor(SupervisedExecutor):
    backend = "process"
    _memory: ExecutorCgroup | None = None
    _oom_kills = 0

    def _contain(self, pid: int) -> None:
        """Put a process just started under its cores and its memory limit, before it loads its
        models: moved in at its hello, its start-up CPU ran under no quota (half a core for 0.7 s
        on every restart) and its models' memory was never charged to its limit (the kernel
        charges a page to the group that allocated it)."""
        self.pid = pid
        self._attach()
        if self.memory_mb is not None:
            try:
                self._memory = self._memory or Hierarchy.find("memory").group(self.id)
                self._memory.set_memory_limit(int(self.memory_mb * 1024 * 1024))
                self._memory.add(pid)
                self._oom_kills = self._memory.oom_kills()
            except OSError as error:
                log.error("executor %s: could not limit its memory to %g MB: %s", self.id, self.memory_mb, error)

    async def _launch(self) -> asyncio.subprocess.Process:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, env.get("PYTHONPATH")]))
        env[PARENT_PID_VARIABLE] = str(os.getpid())  # checked once it dies with its parent (executors/worker.py)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *self.worker_arguments(f"unix:{self.socket_path}"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            # Out of the gateway's process group: a terminal's Ctrl-C (SIGINT to the foreground
            # group) reaches the gateway alone, which drains and then stops its executors.
            start_new_session=True,
        )
        log.info("executor %s: started process %d for %s on %s", self.id, process.pid, ", ".join(self.models), self.device)
        self._contain(process.pid)
        asyncio.create_task(self._relay_output(process))
        return process

    async def _relay_output(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            self._output_line(raw.decode(errors="replace").rstrip())

    async def _wait_exit(self, handle: asyncio.subprocess.Process) -> str:
        code = await handle.wait()
        if self._memory is not None and self._memory.oom_kills() > self._oom_kills:
            return f"killed by the kernel: out of memory (over its limit of {self.memory_mb:g} MB, memory_mb)"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    async def _kill(self, handle: asyncio.subprocess.Process) -> None:
        if handle.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                handle.kill()
        await handle.wait()

    async def stop(self) -> None:
        await super().stop()
        if self._memory is not None:
            self._memory.remove()
