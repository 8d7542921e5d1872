"""The executor process: ONNX Runtime sessions behind the executor protocol.

Started by a backend as ``python -m executors.worker --connect SOCKET --model NAME=PATH ...``.
It connects to the gateway, sends ``hello`` with the signature of every model it holds, then
runs one batch at a time (one outstanding request keeps the execution time predictable, as in
Clockwork Section 4.1) until the gateway closes the connection. A batch that carries a latest
start time it can no longer keep is answered ``late`` and not run (Clockwork Section 4.4).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort

from executors.batch_shapes import FixedBatchSession, why_not_fixed, why_not_on_zeros
from executors.names import PARENT_PID_VARIABLE
from executors.tensors import KSERVE_TO_NUMPY, describe
from executors.wire import encode_frame, pack_tensors, read_frame_blocking, send_frame, unpack_tensors

log = logging.getLogger("executors.worker")

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def load_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries that pip installed (onnxruntime-gpu[cuda,cudnn]) before
    the first CUDA session; where they are missing the CUDA provider fails, the session falls back
    to the CPU and ``open_session`` logs it."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception as error:  # a missing library is reported by the session that needs it
            log.warning("could not preload the CUDA libraries: %s", error)


def open_session(
    path: str, threads: int, provider: str, device_id: int, cudnn_conv_algo_search: str = "EXHAUSTIVE"
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Spinning pool threads burn cores that the control plane is trying to account for.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers: list[Any] = [PROVIDERS[provider]]
    if provider == "cuda":
        cuda = {"device_id": device_id, "cudnn_conv_algo_search": cudnn_conv_algo_search}
        providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    session = ort.InferenceSession(path, options, providers=providers)
    taken = session.get_providers()[0]
    if taken != PROVIDERS[provider]:
        log.error("asked for %s for %s but ONNX Runtime took %s", PROVIDERS[provider], path, taken)
    return session


def warm_up(session: ort.InferenceSession | FixedBatchSession, max_batch: int) -> tuple[list[int], float, str | None]:
    """Run ``session`` once on zeros at each batch size it will see (Triton's model warm-up): its
    fixed sizes (executors/batch_shapes.py), else 1..``max_batch``. The CUDA provider plans a
    convolution on the first run of a shape (and again at every change of shape: hence the fixed
    sizes) and CUDA loads kernels on first use: without it the first batches pay that (up to
    600 ms for the first batch of a CNN on an H200), and the GPU's latency profile learns it as
    l(b). Returns the batch sizes run, the milliseconds it took and, where the model was not
    warmed, why: an input with another free dimension than the batch (its shapes are only known
    from requests), of strings, or a model that fails on zeros."""
    reason = why_not_on_zeros(session)
    if reason:
        return [], 0.0, reason
    inputs = describe(session)["inputs"]
    # An input without a free batch dimension takes its own shape at every size; a model with no
    # such dimension anywhere takes one shape only.
    batched = {spec["name"]: spec["shape"][:1] == [-1] for spec in inputs}
    if isinstance(session, FixedBatchSession):
        sizes = session.sizes
    else:
        sizes = list(range(1, max_batch + 1)) if any(batched.values()) else [1]
    began = time.perf_counter()
    try:
        for batch in sizes:
            feeds = {
                spec["name"]: np.zeros(
                    [batch, *spec["shape"][1:]] if batched[spec["name"]] else spec["shape"], KSERVE_TO_NUMPY[spec["datatype"]]
                )
                for spec in inputs
            }
            session.run(None, feeds)
    except Exception as error:  # a model that cannot run on zeros is served unwarmed, as profiling.py does
        return [], (time.perf_counter() - began) * 1000.0, f"it failed on zeros at batch {batch}: {type(error).__name__}: {error}"
    return sizes, (time.perf_counter() - began) * 1000.0, None


def as_onnx_feed(array: np.ndarray) -> np.ndarray:
    """ONNX Runtime reads string tensors from str objects (it would store the repr of bytes)."""
    if array.dtype == np.object_:
        return np.vectorize(lambda b: b.decode("utf-8", errors="replace") if isinstance(b, bytes) else b, otypes=[object])(array)
    return array


def late_by_ms(latest: float | None, now: float) -> float | None:
    """How late a batch is when it would begin at ``now`` against its ``latest`` start (None: in
    time, or no latest start). Clockwork Section 4.4: a worker that cannot begin an action by its
    ``latest`` cancels it and tells the controller, which alone decides what happens next; run
    late, its batch would end past the deadline the controller planned it for."""
    if latest is None or now <= latest:
        return None
    return (now - latest) * 1000.0


def connect(address: str) -> socket.socket:
    if address.startswith("tcp:"):
        host, port = address[4:].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address.removeprefix("unix:"))
    return sock


def serve(
    sock: socket.socket,
    sessions: dict[str, ort.InferenceSession],
    provider: str,
    emulate: dict[str, tuple[float, float]] | None = None,
    emulate_zeros: bool = False,
    reopen: Callable[[str], ort.InferenceSession] | None = None,
    warmed: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Answer infer frames until the gateway hangs up.

    ``emulate`` maps a model to a GPU latency profile (per-item ms, fixed ms): the batch is
    computed here (so results are real) and then held until l(b) has passed, the way Symphony's
    authors emulated GPUs; a batch that takes longer than l(b) to compute is logged once. With
    ``emulate_zeros`` a model whose outputs have fixed shapes apart from the batch is not
    computed at all: it answers zeros of those shapes after l(b), so that emulating a GPU costs
    no CPU (for benchmarks of scheduling, never for results).

    ``reopen`` (a GPU whose memory is a cache of models, Clockwork Section 4): the sessions are
    closed once described, and a batch's header says what to do first: ``unload`` closes those
    models' sessions (UNLOAD), and a model without a session is opened again (LOAD), held for
    ``load_ms`` in all where its GPU is emulated.

    ``warmed`` (what ``warm_up`` did, per model) goes to the gateway in the hello.
    """
    emulate = emulate or {}
    slow_logged: set[str] = set()
    zero_outputs = {}
    if emulate_zeros:
        for name in emulate:
            specs = describe(sessions[name])["outputs"]
            if all(-1 not in spec["shape"][1:] for spec in specs):
                zero_outputs[name] = specs
                log.warning("%s: emulated GPU answers zeros (no computation)", name)
    stream = sock.makefile("rb", buffering=1 << 20)

    def send(header: dict[str, Any], buffers: list[Any] | None = None) -> None:
        send_frame(sock, encode_frame(header, buffers))

    models = {name: describe(session) for name, session in sessions.items()}
    taken = {name: session.get_providers()[0] for name, session in sessions.items()}
    # The clock reading lets the gateway check that "latest" in an infer frame means the same
    # instant here (executors/wire.py).
    clock = time.perf_counter()
    send({
        "kind": "hello", "pid": os.getpid(), "provider": provider, "providers": taken, "models": models, "clock": clock,
        "warmed": warmed or {},
    })  # fmt: skip
    if reopen is not None:
        sessions.clear()  # nothing held until loaded
    while True:
        frame = read_frame_blocking(stream)
        if frame is None:
            return
        header, payload = frame
        request_id = header.get("id")
        try:
            late_ms = late_by_ms(header.get("latest"), time.perf_counter())
            if late_ms is not None:
                send({"kind": "late", "id": request_id, "late_ms": late_ms})
                continue
            if reopen is not None:
                load_model(sessions, header, reopen, emulate)
            session = sessions[header["model"]]
            feeds = {name: as_onnx_feed(array) for name, array in unpack_tensors(header["tensors"], payload).items()}
            started = time.perf_counter()
            names = [arg.name for arg in session.get_outputs()]
            if header["model"] in zero_outputs:
                rows = batch_rows(feeds)
                outputs = [
                    np.zeros([rows, *spec["shape"][1:]], dtype=KSERVE_TO_NUMPY[spec["datatype"]])
                    for spec in zero_outputs[header["model"]]
                ]
            else:
                outputs = session.run(names, feeds)
            compute_ms = (time.perf_counter() - started) * 1000.0
            if header["model"] in emulate:
                per_item_ms, fixed_ms = emulate[header["model"]]
                rows = batch_rows(feeds)
                target_ms = per_item_ms * rows + fixed_ms
                if compute_ms > target_ms and header["model"] not in slow_logged:
                    slow_logged.add(header["model"])
                    log.warning("%s: computing took %.2f ms, over the emulated %.2f ms", header["model"], compute_ms, target_ms)
                time.sleep(max(0.0, target_ms - compute_ms) / 1000)
                compute_ms = max(compute_ms, target_ms)
            descriptions, buffers = pack_tensors({n: np.asarray(o) for n, o in zip(names, outputs, strict=True)})
            # The process's CPU time so far, to the nanosecond: the kernel's per-process counters
            # that the gateway could read from outside tick at 10 ms, coarser than a request.
            cpu_s = time.process_time()
            send({"kind": "result", "id": request_id, "compute_ms": compute_ms, "cpu_s": cpu_s, "tensors": descriptions}, buffers)
        except Exception as error:  # the model's error goes back to the request, the executor lives on
            send({"kind": "error", "id": request_id, "message": f"{type(error).__name__}: {error}"})


def batch_rows(feeds: dict[str, Any]) -> int:
    """A batch's rows: its first input's leading dimension; 1 for a model whose inputs are
    scalars (rank 0) or that has none."""
    shape = next(iter(feeds.values())).shape if feeds else ()
    return shape[0] if shape else 1


def load_model(
    sessions: dict[str, ort.InferenceSession],
    header: dict[str, Any],
    reopen: Callable[[str], ort.InferenceSession],
    emulate: dict[str, tuple[float, float]],
) -> None:
    """Carry out a batch's UNLOADs and its model's LOAD (an emulated GPU's held for ``load_ms``)."""
    for victim in header.get("unload", ()):
        sessions.pop(victim, None)
    model = header["model"]
    if model in sessions:
        return
    began = time.perf_counter()
    sessions[model] = reopen(model)
    if model in emulate:
        took_ms = (time.perf_counter() - began) * 1000
        time.sleep(max(0.0, float(header.get("load_ms", 0.0)) - took_ms) / 1000)


def _named(items: list[str]) -> dict[str, str]:
    """NAME=VALUE options, by name."""
    return dict(item.partition("=")[::2] for item in items)


def fix_batch_sizes(
    sessions: dict[str, Any], largest: dict[str, int], open_another: Callable[[str], ort.InferenceSession]
) -> None:
    """Put each model of ``largest`` (model -> its largest batch) that can run at fixed batch sizes
    on sessions of its own per size (executors/batch_shapes.py); the others stay as they are."""
    for name, max_batch in largest.items():
        reason = why_not_fixed(sessions[name])
        if reason:
            log.warning("%s: runs each batch at its own size: %s", name, reason)
            continue
        try:
            sessions[name] = FixedBatchSession(sessions[name], functools.partial(open_another, name), max_batch)
        except Exception as error:  # out of GPU memory for another copy, say: one session, as before
            log.error("%s: runs each batch at its own size: a session per size could not be opened: %s", name, error)
            continue
        log.info("%s: runs at batch sizes %s (padded with zero rows)", name, sessions[name].sizes)


def warm_up_models(sessions: dict[str, Any], largest: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Warm each model of ``largest`` up (``warm_up``); what was done, per model, for the hello."""
    warmed: dict[str, dict[str, Any]] = {}
    for name, max_batch in largest.items():
        sizes, took_ms, skipped = warm_up(sessions[name], max_batch)
        warmed[name] = {"batches": sizes, "ms": round(took_ms, 3), "skipped": skipped}
        if skipped:
            log.warning("%s: not warmed up: %s", name, skipped)
        else:
            log.info("%s: warmed up at batch sizes %s in %.0f ms", name, sizes, took_ms)
    return warmed


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Have the kernel kill this process when the one that started it ends (Linux's
    PR_SET_PDEATHSIG). An executor notices a gateway that is gone only at its next read of the
    connection; one stopped, or still opening its sessions (minutes, with many threads), outlived
    a killed gateway for good. Elsewhere, a no-op."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # A gateway killed while this process still imported ONNX Runtime (a second or more) ended
    # before the request above, which then waits for a parent that is already gone.
    parent = os.environ.get(PARENT_PID_VARIABLE)
    if parent is not None and parent != str(os.getppid()):
        sys.exit(f"executor: its gateway (pid {parent}) has ended")


def leave_stopping_to_the_gateway() -> None:
    """Ignore SIGINT and SIGTERM: the gateway stops its executors itself, once its drain is over.
    Ctrl-C in a terminal, ``kill -- -PGID`` and systemd's stop (KillMode=control-group) signal
    every process of the gateway at once; the executors died at once and failed the batches the
    drain was to finish. A gateway that dies takes them with it (``die_with_parent``)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="executors.worker")
    parser.add_argument("--connect", required=True, help="unix:PATH or tcp:HOST:PORT of the gateway")
    parser.add_argument("--model", action="append", required=True, help="NAME=PATH of an ONNX model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--provider", choices=sorted(PROVIDERS), default="cpu")
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--emulate", action="append", default=[], help="NAME=PER_ITEM_MS,FIXED_MS: hold batches of NAME for l(b)")
    parser.add_argument("--emulate-zeros", action="store_true", help="emulated models answer zeros instead of computing")
    parser.add_argument("--model-cache", action="store_true", help="hold no model until a batch LOADs it (GPU memory as a cache)")
    parser.add_argument("--warmup", action="append", default=[], help="NAME=MAX_BATCH: run NAME at each size it will see first")
    parser.add_argument("--fixed-batches", action="append", default=[], help="NAME=MAX_BATCH: run NAME at fixed batch sizes")
    parser.add_argument("--cudnn-conv-algo-search", choices=["EXHAUSTIVE", "HEURISTIC", "DEFAULT"], default="EXHAUSTIVE")
    args = parser.parse_args(argv)
    die_with_parent()
    leave_stopping_to_the_gateway()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s executor[{os.getpid()}] %(levelname)s %(message)s")
    if args.provider == "cuda":
        load_cuda_libraries()
    paths = _named(args.model)

    def reopen(name: str) -> ort.InferenceSession:
        return open_session(paths[name], args.threads, args.provider, args.device_id, args.cudnn_conv_algo_search)

    sessions: dict[str, Any] = {}
    for name in paths:
        began = time.perf_counter()
        sessions[name] = reopen(name)
        if args.provider == "cuda":  # a progress line: the gateway waits for the hello while lines come
            log.info("%s: session opened in %.1f s", name, time.perf_counter() - began)
    fix_batch_sizes(sessions, {name: int(n) for name, n in _named(args.fixed_batches).items()}, reopen)
    warmed = warm_up_models(sessions, {name: int(n) for name, n in _named(args.warmup).items()})
    emulate = {}
    for name, numbers in _named(args.emulate).items():
        per_item, fixed = (float(x) for x in numbers.split(","))
        emulate[name] = (per_item, fixed)
    sock = connect(args.connect)
    # What start-up made (modules, sessions) lives as long as the process: out of the collector's
    # reach, a full collection no longer walks it (23,000 objects, 6-8 ms on the developers' VM,
    # in the middle of a batch), as in gateway/server.py's serve.
    gc.collect()
    gc.freeze()
    # The gateway going away ends the executor: nothing is left to answer.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        serve(sock, sessions, args.provider, emulate, args.emulate_zeros, reopen if args.model_cache else None, warmed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
