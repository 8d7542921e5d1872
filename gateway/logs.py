"""The gateway's log: text for people, or one JSON object per line for a log pipeline.

``gateway serve`` and ``gateway worker`` take ``--log-format text|json``. In JSON every record
is one object, ``{"time", "level", "logger", "message", ...}``, with the record's structured
fields beside them and a traceback, if any, as ``exception``; no record spans two lines. In text
the same fields follow the message as ``key=value`` (logfmt: a value with a space or a quote is
quoted).

Two loggers carry one line per request: ``gateway.request`` (INFO), one per infer request with
its model, id, status, outcome, where it ran and its times (gateway/observe.py), and
``gateway.access`` (``--access-log``), one per HTTP request of any kind, written by aiohttp
after the response (``AccessLog``).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import logging
import logging.handlers
import os
import queue
import sys
import threading
from time import monotonic, perf_counter
from typing import Any

import orjson
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
REQUEST_LOG = logging.getLogger("gateway.request")
ACCESS_LOG = logging.getLogger("gateway.access")
# A record's structured fields travel in its ``extra``, under this one name, so that they never
# collide with the attributes logging itself sets on a record.
FIELDS = "fields"
# Where gateway/observe.py leaves each HTTP request's id and its time of arrival
# (time.perf_counter), for the access log.
REQUEST_ID_KEY = web.RequestKey("request_id", str)
REQUEST_START_KEY = web.RequestKey("request_start", float)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, FIELDS, None)
    return fields if isinstance(fields, dict) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        try:
            return orjson.dumps(entry, default=str).decode()
        except (TypeError, orjson.JSONEncodeError):
            # orjson refuses lone surrogates, which aiohttp leaves in header bytes that are not
            # UTF-8; json escapes them, and escapes are valid JSON.
            return json.dumps(entry, default=str)


def _logfmt(value: Any) -> str:
    if value is None:
        return "-"
    text = str(value)
    if not text or any(c.isspace() or not c.isprintable() or c in '"=\\' for c in text):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, the record's fields after its message as ``key=value``."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        text = super().formatMessage(record)
        fields = _fields(record)
        if not fields:
            return text
        return text + " " + " ".join(f"{key}={_logfmt(value)}" for key, value in fields.items())


# Records waiting for the writer thread, at most: about 20 MB of them. Past that, stderr's reader
# has stopped reading (a pipe nobody drains), and a request log line per request would otherwise
# grow the gateway's memory without end.
MAX_QUEUED_RECORDS = 10_000
# At exit, how long the writer thread may take to write what is still queued. Where stderr's
# reader has stopped reading, the thread is stuck in write() for good: waiting for it held the
# process after SIGTERM for as long as nobody read (forever, for a pipe nobody drains).
EXIT_WRITE_WAIT_S = 2.0


class _DescriptorWriter(logging.Handler):
    """Writes each record, one line, straight to a file descriptor (stderr's), from the writer
    thread alone, holding no lock while it writes.

    Not through ``sys.stderr`` (a StreamHandler): a write that never returns (a reader that
    stopped reading) held sys.stderr's buffer lock and the handler's lock, and at exit logging's
    shutdown takes every handler's lock and the interpreter flushes sys.stderr: the process
    never ended."""

    def __init__(self, descriptor: int):
        super().__init__()
        self.descriptor = descriptor

    def handle(self, record: logging.LogRecord) -> bool:
        # Logging's own handle() holds the handler's lock around emit: one thread calls this.
        passed = bool(self.filter(record))
        if passed:
            self.emit(record)
        return passed

    def emit(self, record: logging.LogRecord) -> None:
        try:
            # As sys.stderr writes what is not UTF-8 (lone surrogates of header bytes, in text).
            line = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
            while line:
                line = line[os.write(self.descriptor, line) :]
        except Exception:
            self.handleError(record)


class DroppedRecords:
    """How many records found the queue full since the last notice (threads count under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> None:
        with self._lock:
            self.count += 1

    def take(self) -> int:
        with self._lock:
            count, self.count = self.count, 0
        return count


class _Writer(logging.handlers.QueueListener):
    """The thread that writes the queued records (a daemon: it never holds the process). Once it
    has caught up after records were dropped (the queue half empty), it writes a warning that
    says how many: written by the handler with the next record, it waited for one, and a gateway
    that went quiet (or exited) never said so."""

    def __init__(self, records: queue.Queue[logging.LogRecord], handler: logging.Handler, dropped: DroppedRecords):
        super().__init__(records, handler)
        self.dropped = dropped

    def handle(self, record: logging.LogRecord) -> None:
        super().handle(record)
        if self.dropped.count and self.queue.qsize() <= self.queue.maxsize // 2 and (count := self.dropped.take()):
            message = f"{count} log records were dropped: stderr was not read"
            super().handle(logging.LogRecord("gateway", logging.WARNING, __file__, 0, message, None, None))

    def stop_within(self, seconds: float) -> None:
        """Write what is queued, for at most ``seconds``, then let the thread be."""
        deadline = monotonic() + seconds
        thread = self._thread
        if thread is None:
            return
        self._thread = None
        with contextlib.suppress(queue.Full):  # full and not draining: the thread is stuck
            self.queue.put(self._sentinel, timeout=seconds)
        thread.join(max(deadline - monotonic(), 0.0))


class _InProcessQueueHandler(logging.handlers.QueueHandler):
    """Hands records to the writer thread as they are: its message made, its traceback kept.
    A record that finds the queue full is dropped and counted in ``dropped`` (the writer says how
    many once it has caught up).

    (QueueHandler's own ``prepare`` folds the traceback into the message, for queues that
    pickle; this queue never leaves the process, and the JSON formatter wants it apart.)"""

    queue: queue.Queue[logging.LogRecord]

    def __init__(self, records: queue.Queue[logging.LogRecord], dropped: DroppedRecords):
        super().__init__(records)
        self.dropped = dropped

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.msg, record.args = record.getMessage(), None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped.add()


def configure_logging(level: str, log_format: str = "text", access_log: bool = False) -> None:
    """Send every record to stderr in ``log_format``; the access log only when asked for.

    The event loop only queues a record: a thread writes it. A request log line per request
    written on the loop would stall every request while stderr's reader (a pipe to a container
    runtime, a terminal) is slow to read.
    """
    writer = _DescriptorWriter(sys.stderr.fileno())
    writer.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    records: queue.Queue[logging.LogRecord] = queue.Queue(MAX_QUEUED_RECORDS)
    dropped = DroppedRecords()
    listener = _Writer(records, writer, dropped)
    listener.start()
    atexit.register(listener.stop_within, EXIT_WRITE_WAIT_S)  # what is queued is written before the process ends
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(_InProcessQueueHandler(records, dropped))
    root.setLevel(level.upper())
    # Python's warnings become records too: in JSON, a bare line on stderr would break the format.
    logging.captureWarnings(True)
    # The access log is asked for or not, whatever the level: it is a log of its own.
    ACCESS_LOG.setLevel(logging.INFO)
    ACCESS_LOG.disabled = not access_log
    # A line per infer request is for machines (JSON), as Triton's server logs no request by
    # default: in text, at a thousand requests a second it would bury everything else.
    REQUEST_LOG.disabled = log_format != "json"


def log_request(fields: dict[str, Any]) -> None:
    """One line of the request log: the fields say it all."""
    REQUEST_LOG.info("infer request", extra={FIELDS: fields})


class AccessLog(AbstractAccessLogger):
    """aiohttp's access logger, one record per HTTP request once its response is written."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        # aiohttp measures ``time`` on the loop's clock, which under uvloop has 1 ms grain.
        start = request.get(REQUEST_START_KEY)
        duration_ms = (perf_counter() - start) * 1000 if start is not None else time * 1000
        fields = {
            "remote": request.remote,
            "method": request.method,
            "path": request.path_qs,
            "status": response.status,
            "bytes": response.body_length,
            "duration_ms": round(duration_ms, 3),
            "user_agent": request.headers.get("User-Agent"),
            "id": request.get(REQUEST_ID_KEY),
        }
        self.logger.info("http request", extra={FIELDS: fields})

    @property
    def enabled(self) -> bool:
        # aiohttp asks once per connection: a disabled access log costs a request nothing.
        return self.logger.isEnabledFor(logging.INFO)
