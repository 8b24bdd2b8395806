"""Fail fast: follow the server's log and stop at its first fatal traceback.

`TracebackDetector` is a line-fed state machine: after a ``Traceback (most
recent call last):`` header, the first unindented line that looks like a
Python exception (``RuntimeError: ...``, ``torch.OutOfMemoryError: ...``) is
the fatal line. Multi-process servers prefix their lines (``[rank0]: ``,
``(EngineCore pid=12) ``); the prefix is dropped, the rest is kept verbatim.

`LogWatcher` streams a container's logs in a thread into a file (secrets
redacted), feeds the detector, and sets an event when a fatal line appears or
the log ends (the container exited), so the runner reacts in milliseconds
instead of waiting for its readiness time limit.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pipeline.errors import DiskError, disk_error

TRACEBACK_HEADER = "Traceback (most recent call last):"
# Optional log prefixes of multi-process servers: "[rank0]: ", "(EngineCore pid=12) ", "(Worker_TP0) ".
_PREFIX = r"(?:\[[^\]\n]{1,64}\]:?[ \t]*|\([^)\n]{1,64}\)[ \t]*)*"
# A module-qualified name (torch._dynamo.exc.Unsupported) or a bare one with an exception-like
# suffix (RuntimeError, KeyboardInterrupt, StopIteration). Bare "INFO:" log lines from other
# processes interleaved with a traceback do not qualify.
_SUFFIXES = "Error|Exception|Interrupt|Exit|Failure|Failed|Unsupported|Iteration|Warning"
_EXC_NAME = rf"(?:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|[A-Za-z_]\w*(?:{_SUFFIXES}))"
EXCEPTION_LINE = re.compile(rf"^{_PREFIX}(?P<line>{_EXC_NAME}(?::[ \t].*|:)?)$")
_HEADER = re.compile(rf"^{_PREFIX}{re.escape(TRACEBACK_HEADER)}\s*$")


def exception_line(line: str) -> str | None:
    """The exception part of `line` if it looks like a traceback's final line."""
    m = EXCEPTION_LINE.match(line.rstrip("\r\n"))
    return m.group("line") if m else None


@dataclass
class TracebackDetector:
    """Feed lines; `fatal` is the first exception line that ends a traceback."""

    # Exception lines (regexes) known to be harmless for this server: ignored.
    ignore: tuple[re.Pattern[str], ...] = ()
    fatal: str | None = None
    last_exception: str | None = None  # last exception-looking line after any traceback header
    traceback: list[str] = field(default_factory=list)
    _in_tb: bool = False

    def feed(self, line: str) -> str | None:
        """Returns the fatal exception line when this line completes the first traceback."""
        text = line.rstrip("\r\n")
        if _HEADER.match(text):
            self._in_tb = True
            if self.fatal is None:
                self.traceback = [text]
            return None
        if not self._in_tb:
            return None
        if self.fatal is None:
            self.traceback.append(text)
        exc = exception_line(text)
        if exc is None:
            return None
        self._in_tb = False
        if any(p.search(exc) for p in self.ignore):
            return None
        self.last_exception = exc
        if self.fatal is None:
            self.fatal = exc
            return exc
        return None


def last_exception_in(text: str, ignore: tuple[str, ...] = ()) -> str | None:
    """The last exception line of `text` that follows a traceback header (None if none)."""
    det = TracebackDetector(ignore=tuple(re.compile(p) for p in ignore))
    for line in text.splitlines():
        det.feed(line)
    return det.last_exception


class LogWatcher:
    """Follow a container's log in a daemon thread.

    `changed` is set whenever something the runner must react to happens: a fatal
    traceback line (`fatal`, `fatal_at`) or the end of the log (`ended`, `ended_at`:
    the container stopped).
    """

    def __init__(
        self,
        stream: Callable[[], Iterator[str]],
        log_path: Path,
        *,
        redact: Callable[[str], str],
        on_line: Callable[[str], None] | None = None,
        tail_lines: int = 200,
        ignore: tuple[str, ...] = (),
    ) -> None:
        self._stream = stream
        self.log_path = log_path
        self._redact = redact
        self._on_line = on_line
        self.detector = TracebackDetector(ignore=tuple(re.compile(p) for p in ignore))
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.changed = threading.Event()
        self.fatal: str | None = None
        self.fatal_at: float | None = None  # time.monotonic()
        self.ended = False
        self.ended_at: float | None = None
        self.error: str | None = None  # the stream itself failed
        self.write_error: DiskError | None = None  # server.log could not be written (full disk)
        self.lines = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="smoke-log-watcher", daemon=True)

    def start(self) -> LogWatcher:
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` s, waking early on a fatal line or the end of the log."""
        return self.changed.wait(timeout)

    def tail_text(self, n: int = 50) -> str:
        with self._lock:
            return "\n".join(list(self.tail)[-n:])

    def _line(self, raw: str, fh: IO[str] | None) -> None:
        line = self._redact(raw)
        if fh is not None and self.write_error is None:
            try:
                fh.write(line + "\n")
                fh.flush()
            except OSError as e:  # keep following the server (in memory); the runner stops the run
                self.write_error = disk_error(e) or DiskError(f"cannot write {self.log_path}: {e}.")
                self.changed.set()
        with self._lock:
            self.tail.append(line)
            self.lines += 1
        if self._on_line is not None:
            self._on_line(line)
        exc = self.detector.feed(line)
        if exc is not None and self.fatal is None:
            self.fatal = exc
            self.fatal_at = time.monotonic()
            self.changed.set()

    def _run(self) -> None:
        fh: IO[str] | None = None
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            fh = self.log_path.open("a", encoding="utf-8")
        except OSError as e:
            self.write_error = disk_error(e) or DiskError(f"cannot write {self.log_path}: {e}.")
        partial = ""
        try:
            for chunk in self._stream():
                partial += chunk
                *complete, partial = partial.split("\n")
                for raw in complete:
                    self._line(raw.rstrip("\r"), fh)
        except Exception as e:  # the engine went away; the runner decides what that means
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if partial:
                self._line(partial.rstrip("\r"), fh)
            if fh is not None:
                try:
                    fh.close()
                except OSError as e:
                    self.write_error = self.write_error or disk_error(e)
            self.ended = True
            self.ended_at = time.monotonic()
            self.changed.set()
