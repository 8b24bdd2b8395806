"""Live progress for long steps: a rich progress bar on a terminal, plain lines elsewhere.

A person watching a 45-minute warm-up must tell a hung server from a slow one: each task shows
what it counts (seconds against a limit, documents, requests, bytes), its rate and a status line
(for the server, its last log line). Off a terminal, on CI (``CI``/``GITHUB_ACTIONS``) or with
``TERM=dumb`` it prints one plain line per task every `interval_s` seconds and one when it ends,
so logs stay readable and greppable.

    progress = Progress.for_stream(sys.stderr)
    with progress.task("server start", total=2700, unit="s") as t:
        t.update(elapsed, status=last_log_line)

The smoke stage uses it (server start, GSM8K with its running score, benchmark rows), and so do
mirror fetches (objects and bytes from git's ``--progress``, `pipeline.sources.mirrors`) and the
image build (the current step against the last build's time for it, `pipeline.image.buildprogress`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

# `pipeline --progress`: "auto" (detect), "plain" (lines, never live), "tty" (live, even undetected)
MODE = "auto"


def is_live(stream: IO[str], env: Mapping[str, str]) -> bool:
    """A terminal, not CI, not a dumb terminal (or as `--progress` says)."""
    if MODE != "auto":
        return MODE == "tty"
    if env.get("CI") or env.get("GITHUB_ACTIONS") or env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.0f} s"
    if unit == "B":
        for step in ("B", "KiB", "MiB", "GiB"):
            if abs(value) < 1024 or step == "GiB":
                return f"{value:.1f} {step}" if step != "B" else f"{value:.0f} B"
            value /= 1024
    shown = f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return f"{shown}{' ' + unit if unit else ''}"


class Task:
    """One counted piece of work; `update` is cheap (call it as often as you like)."""

    def __init__(self, owner: Progress, description: str, total: float | None, unit: str) -> None:
        self.owner = owner
        self.description = description
        self.total = total
        self.unit = unit
        self.completed = 0.0
        self.status = ""
        self.started = time.monotonic()
        self._last_line = float("-inf")  # the first update prints at once
        self._rich_id: Any = None

    def update(
        self,
        completed: float | None = None,
        *,
        advance: float = 0.0,
        status: str | None = None,
        total: float | None = None,
        description: str | None = None,
    ) -> None:
        if total is not None:
            self.total = total
        if description is not None:
            self.description = description
        if completed is not None:
            self.completed = completed
        self.completed += advance
        if status is not None:
            self.status = self.owner.redact(" ".join(status.split())[:160])
        self.owner._refresh(self)

    def line(self, final: bool = False) -> str:
        """The plain-text form: `server start: 120 s / 2700 s (4%), 2 min elapsed · last log line`."""
        elapsed = time.monotonic() - self.started
        done = _fmt(self.completed, self.unit)
        if self.total:
            done += f" / {_fmt(self.total, self.unit)} ({min(self.completed / self.total, 1.0):.0%})"
        if self.unit != "s" and elapsed >= 1 and self.completed:  # no rate from a blink
            done += f", {_fmt(self.completed / elapsed, self.unit)}/s"
        parts = [f"{self.description}: {done}", f"{elapsed:.0f} s elapsed" + (" (done)" if final else "")]
        return " · ".join(parts + ([self.status] if self.status else []))


class Progress:
    def __init__(
        self,
        stream: IO[str],
        *,
        live: bool,
        interval_s: float = 30.0,
        redact: Callable[[str], str] = str,
    ) -> None:
        self.stream = stream
        self.live = live
        self.interval_s = interval_s
        self.redact = redact  # status lines can quote a server's log: secrets masked first
        self._rich: Any = None

    @classmethod
    def for_stream(
        cls,
        stream: IO[str] | None = None,
        env: Mapping[str, str] | None = None,
        *,
        interval_s: float = 30.0,
        redact: Callable[[str], str] = str,
    ) -> Progress:
        out = stream or sys.stderr
        live = is_live(out, os.environ if env is None else env)
        return cls(out, live=live, interval_s=interval_s, redact=redact)

    @contextmanager
    def task(self, description: str, *, total: float | None = None, unit: str = "") -> Iterator[Task]:
        t = Task(self, description, total, unit)
        if self.live:
            self._start_rich(t)
        try:
            yield t
        finally:
            if self.live and self._rich is not None:
                self._rich.remove_task(t._rich_id)
                if not self._rich.tasks:
                    self._rich.stop()
                    self._rich = None
            else:
                self._write(t.line(final=True))

    # -- backends ---------------------------------------------------------------------------

    def _start_rich(self, t: Task) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as RichProgress

        if self._rich is None:
            self._rich = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[unit]}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}", style="dim"),
                console=Console(file=self.stream),
                transient=True,
            )
            self._rich.start()
        t._rich_id = self._rich.add_task(t.description, total=t.total, unit=t.unit, status="")

    def _refresh(self, t: Task) -> None:
        if self.live and self._rich is not None:
            self._rich.update(
                t._rich_id, completed=t.completed, status=t.status, total=t.total, description=t.description
            )
            return
        now = time.monotonic()
        if now - t._last_line >= self.interval_s:
            t._last_line = now
            self._write(t.line())

    def _write(self, line: str) -> None:
        self.stream.write(f"  … {line}\n")
        self.stream.flush()
