"""Process executors: each one an OS process on this host running ``executors.worker``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from executors.lifecycle import SupervisedExecutor
from executors.limits import ExecutorCgroup, Hierarchy
from executors.names import PARENT_PID_VARIABLE

log = logging.getLogger("executors")

# The project root, so that the worker imports this very checkout even when not installed.
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


# The most of one output line that goes to the log.
LONGEST_LINE_BYTES = 8192


async def relay_lines(stream: asyncio.StreamReader, line: Callable[[str], None]) -> None:
    """Each line of ``stream`` to ``line`` until its end; a line longer than the stream's limit
    (64 KiB) is cut to ``LONGEST_LINE_BYTES``, the rest of it left out. Read by ``async for``, such a line raised
    ValueError and ended the relay: nothing read the pipe any more, and once it was full the
    executor blocked in ONNX Runtime's log of a failed run (whose words carry a client's input:
    a Reshape to a shape of 40,000 dimensions), killed as hung a few requests later."""
    cut = False  # the rest of a line that was cut is being left out
    while True:
        try:
            raw = await stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as end:  # the stream ended
            if end.partial and not cut:
                line(end.partial.decode(errors="replace").rstrip())
            return
        except asyncio.LimitOverrunError as over:
            raw = await stream.readexactly(over.consumed)
            if not cut:
                line(f"{raw[:LONGEST_LINE_BYTES].decode(errors='replace')} ... (cut: the line goes on past {len(raw)} bytes)")
            cut = True
            continue
        if not cut:
            line(raw.decode(errors="replace").rstrip())
        cut = False


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
        await relay_lines(process.stdout, self._output_line)

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
