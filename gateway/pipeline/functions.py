"""A pipeline's Python steps: "FILE.py:NAME", a function of a dict of numpy arrays that returns one.

The file is loaded once, at start, as a module of its own (it need not be on sys.path); a name
that is not there, or not callable, is a config error.
"""

from __future__ import annotations

import importlib.util
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import numpy as np

StepFunction = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def load_function(reference: str, base: Path) -> StepFunction:
    """The function ``reference`` names, its file relative to ``base``; ValueError saying why not."""
    file, colon, name = reference.rpartition(":")
    if not colon or not file.endswith(".py") or not name.isidentifier():
        raise ValueError(f'a function is "FILE.py:NAME", got {reference!r}')
    path = (base / file).resolve()
    if not path.is_file():
        raise ValueError(f"no Python file at {path}")
    module_name = f"gateway_pipeline_{path.stem}_{abs(hash(path)):x}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as error:  # a file that exits at import is a config error too
            del sys.modules[module_name]
            raise ValueError(f"{path} failed to load: {type(error).__name__}: {error}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{path} has no function '{name}'")
    return function


class StepThreads(Executor):
    """``count`` threads that run a pipeline's function steps and do not hold up the process's
    exit. A function that never returns is waited for no longer than its request's deadline,
    but a ThreadPoolExecutor's threads are joined when the interpreter exits: a gateway that had
    drained and stopped its executors after SIGTERM never exited (a second signal did nothing).
    Daemon threads end with the process; what runs in them is beyond its requests by then.

    A call given up at its deadline still holds its thread (Python cannot stop a thread): once
    ``count`` such calls hung, every later request of the pipeline waited in the queue to its own
    deadline. ``given_up`` starts a thread in its place, and the held one ends when its call
    does; at most ``max_held`` are replaced so, and past that the pipeline runs short of threads
    (a function that hangs at every call would otherwise make a thread of every request)."""

    def __init__(self, count: int, name: str, max_held: int = 64):
        self._count, self._name, self._max_held = count, name, max_held
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple, dict]] = queue.SimpleQueue()
        self._started = False
        self._lock = threading.Lock()
        self._given_up: set[Future] = set()  # calls past their deadline, each replaced by a thread
        self._threads = 0  # started so far, for the names

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args, kwargs))
        with self._lock:
            if not self._started:  # started at the first call: a pipeline never asked holds none
                self._started = True
                for _ in range(self._count):
                    self._start_thread()
        return future

    def given_up(self, future: Future) -> None:
        """The caller no longer waits for ``future``: a thread takes its place while it runs on."""
        with self._lock:
            if future.done() or future in self._given_up or len(self._given_up) >= self._max_held:
                return
            # Still queued: cancelled, no thread held. Returned meanwhile: its thread goes on.
            if not future.cancel() and not future.done():
                self._given_up.add(future)
                self._start_thread()

    @property
    def held(self) -> int:
        """Threads held by calls given up and not yet returned."""
        with self._lock:
            return len(self._given_up)

    def _start_thread(self) -> None:
        self._threads += 1
        threading.Thread(target=self._work, name=f"{self._name}_{self._threads}", daemon=True).start()

    def _work(self) -> None:
        while True:
            future, fn, args, kwargs = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:  # the future carries it to the step, whatever it is
                future.set_exception(error)
            else:
                future.set_result(result)
            with self._lock:
                if future in self._given_up:  # another thread took this one's place meanwhile
                    self._given_up.discard(future)
                    return
