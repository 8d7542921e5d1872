"""An executor that is slow to start is waited for while it keeps printing, not while it is silent.

A real GPU executor opens one session per batch size for each model and warms each up before it
says hello (executors/batch_shapes.py, executors/worker.py), which for many large models takes
longer than START_TIMEOUT_S; it prints a line per model as it goes. The gateway gives up on a
launch only once it has said nothing for START_TIMEOUT_S. Here START_TIMEOUT_S is 1 s and the
worker is delayed by 3 s before it starts, printing or silent.
"""

from __future__ import annotations

import pytest

import executors.lifecycle
from executors.lifecycle import ExecutorStartError
from executors.process import ProcessExecutor

KIND = {"device": "cpu", "threads": 1, "cores": 1.0}


def delayed(executor: ProcessExecutor, printing: bool) -> ProcessExecutor:
    """Make ``executor``'s launch wait 3 s before the worker runs, silent or printing a line every
    0.2 s until its hello (a CPU worker prints nothing while it imports and opens its session,
    which alone can take most of the 1 s on a slow machine)."""
    ticking = (
        "def tick():\n    i = 0\n    while True:\n        print('loading', i, flush=True)\n        i += 1\n"
        "        time.sleep(0.2)\nthreading.Thread(target=tick, daemon=True).start()\n"
    )
    original = executor.worker_arguments

    def arguments(connect, model_paths=None):
        worker = original(connect, model_paths)[2:]  # without "-m executors.worker"
        script = (
            f"import runpy, sys, threading, time\n{ticking if printing else ''}time.sleep(3)\n"
            f"sys.argv = ['executors.worker', *{worker!r}]\nrunpy.run_module('executors.worker', run_name='__main__')"
        )
        return ["-c", script]

    executor.worker_arguments = arguments  # type: ignore[method-assign]
    return executor


@pytest.fixture
def short_deadline(monkeypatch):
    monkeypatch.setattr(executors.lifecycle, "START_TIMEOUT_S", 1.0)


async def test_a_launch_that_keeps_printing_is_waited_for(short_deadline, example_models, tmp_path):
    executor = delayed(ProcessExecutor("slow", {"mlp": example_models / "mlp.onnx"}, **KIND, socket_dir=tmp_path), printing=True)
    await executor.start()
    try:
        assert executor.ready and "loading 9" in executor.output_tail
    finally:
        await executor.stop()


async def test_a_silent_launch_is_given_up_after_the_deadline(short_deadline, example_models, tmp_path):
    executor = delayed(ProcessExecutor("mute", {"mlp": example_models / "mlp.onnx"}, **KIND, socket_dir=tmp_path), printing=False)
    with pytest.raises(ExecutorStartError, match="no hello and no output for 1 s"):
        await executor.start()
    await executor.stop()
