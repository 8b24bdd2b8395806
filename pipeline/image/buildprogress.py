"""The image build as a progress task: the current step, its time against the last build's.

Fed the build's output line by line (BuildKit's ``--progress=plain`` or the classic builder's
``Step i/n : ...``), it shows steps done (of the last build's count, or the classic builder's n),
the step running now, how long it has run and how long the same step took last time, so an aiter
compile at 20 minutes of its usual 25 reads as slow, not hung. Step times are kept per model in
``<cache>/build-times/<model>.json`` after a successful build (BuildKit's own ``DONE 12.3s``;
the classic builder's by the wall clock); a step from cache keeps its last real time.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_write_text
from pipeline.log import Logger
from pipeline.progress import Progress, Task

_BK_VERTEX = re.compile(r"^#(\d+) (.*)$")
_BK_STEP = re.compile(r"^\[(?:\S+ )?\d+/\d+\] ")
_BK_DONE = re.compile(r"^DONE (\d+(?:\.\d+)?)s$")
_CLASSIC_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_MOUNT = re.compile(r"--mount=\S+\s+")


def timings_path(cache_dir: Path, model: str) -> Path:
    return cache_dir / "build-times" / f"{re.sub(r'[^A-Za-z0-9._-]', '_', model or 'context')}.json"


def _load(path: Path | None) -> dict[str, float]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, dict):
        return {}
    return {str(k): float(v) for k, v in steps.items() if isinstance(v, int | float)}


class BuildProgress:
    def __init__(self, log: Logger, path: Path | None, *, progress: Progress | None = None) -> None:
        self.path = path
        self.last = _load(path)
        self.progress = progress or Progress.for_stream(log.stream, redact=log.redact)
        self._stack = contextlib.ExitStack()
        self.task: Task | None = None
        self.titles: dict[str, str] = {}  # BuildKit vertex -> step title
        self.running: dict[str, float] = {}  # step title -> when it started (monotonic)
        self.took: dict[str, float] = {}  # this build's step times
        self.cached: set[str] = set()
        self.total: int | None = len(self.last) or None
        self.current = ""

    @property
    def live(self) -> bool:
        return self.progress.live

    def __call__(self, line: str) -> None:
        now = time.monotonic()
        if m := _CLASSIC_STEP.match(line):
            if self.current:  # the classic builder runs one step after another
                self.took[self.current] = now - self.running.pop(self.current, now)
            self.total = int(m.group(2))
            self._start(f"Step {m.group(1)}/{m.group(2)} : {m.group(3)}", now)
        elif line.strip() == "---> Using cache" and self.current:
            self.cached.add(self.current)
        elif m := _BK_VERTEX.match(line):
            vid, rest = m.group(1), m.group(2)
            if vid not in self.titles:
                if _BK_STEP.match(rest):
                    self.titles[vid] = _MOUNT.sub("", rest)
                    self._start(self.titles[vid], now)
            elif (done := _BK_DONE.match(rest)) or rest == "CACHED":
                title = self.titles[vid]
                self.running.pop(title, None)
                if done:
                    self.took[title] = float(done.group(1))
                else:
                    self.cached.add(title)
                    self.took[title] = 0.0
                if self.current == title:
                    self.current = next(reversed(self.running), "")
        self._show(now)

    def _start(self, title: str, now: float) -> None:
        self.running[title] = now
        self.current = title
        if self.total is not None and len(self.titles) > self.total:  # more steps than last time
            self.total = len(self.titles)

    def _show(self, now: float) -> None:
        if not self.current and self.task is None:
            return
        if self.task is None:
            self.task = self._stack.enter_context(self.progress.task("build", total=self.total, unit="steps"))
        status = ""
        if self.current:
            ran = now - self.running.get(self.current, now)
            last = self.last.get(self.current)
            against = f"last build {last:.0f} s" if last is not None else "new step"
            status = f"{self.current[:90]} · {ran:.0f} s ({against})"
        self.task.update(len(self.took), total=self.total, status=status)

    def close(self, *, succeeded: bool) -> None:
        """End the task; after a successful build, remember its step times for the next one."""
        self._stack.close()
        now = time.monotonic()
        for title, started in self.running.items():  # the classic builder's last step
            if not _BK_STEP.match(title):
                self.took.setdefault(title, now - started)
        if not succeeded or self.path is None or not self.took:
            return
        steps = dict(self.last)
        for title, seconds in self.took.items():
            if title not in self.cached:
                steps[title] = round(seconds, 1)
            else:
                steps.setdefault(title, 0.0)
        keep = {t: steps[t] for t in [*self.titles.values(), *self.took] if t in steps}
        with contextlib.suppress(OSError, PipelineError):  # a cache we cannot write costs only the comparison
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps({"steps": keep}, indent=1, sort_keys=True) + "\n")
