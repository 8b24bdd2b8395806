"""One logger for the whole run.

Console: one line per stage with its duration and ✓/✕, details only with -v.
Run directory: `pipeline.log` gets everything (debug included), always.
GitHub Actions (`GITHUB_ACTIONS=true`): stages fold into `::group::`, errors
become `::error::` annotations and a Markdown summary is appended to
`$GITHUB_STEP_SUMMARY`.

Secrets registered with `mask()` are replaced by `***` in every line written
anywhere (console, log file, summary), and `::add-mask::` is sent on Actions.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

from pipeline.errors import PipelineError

StageStatus = Literal["running", "ok", "failed", "skipped", "stopped"]  # stopped: no GPUs here, Ctrl-C

# The stage marks, and what a terminal that cannot show them gets instead.
MARKS: dict[str, str] = {"ok": "✓", "skipped": "↷", "stopped": "■", "failed": "✕", "running": "▶"}
ASCII_MARKS: dict[str, str] = {"ok": "+", "skipped": ">", "stopped": "=", "failed": "x", "running": "-"}
# Masked in every line from the start (`Logger.from_env`).
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "REGISTRY_PASSWORD", "PIPELINE_REGISTRY_PASSWORD")


def shows_marks(stream: IO[str]) -> bool:
    """Whether the stream's encoding can write the stage marks (not so for LANG=C / ASCII)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"  # a StringIO holds any text
    try:
        "".join(MARKS.values()).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


@dataclass
class StageRecord:
    name: str
    status: StageStatus = "running"
    seconds: float = 0.0
    figure: str = ""  # the stage's key figure for the summary table


@dataclass
class Logger:
    verbosity: int = 0  # 0 quiet, 1 -v, 2 -vv
    stream: IO[str] = field(default_factory=lambda: sys.stderr)
    log_file: Path | None = None
    github: bool = False
    step_summary: Path | None = None
    stages: list[StageRecord] = field(default_factory=list)
    _secrets: set[str] = field(default_factory=set)
    _fh: IO[str] | None = None
    file_error: OSError | None = None  # why the log file stopped being written
    marks: Mapping[str, str] | None = None  # None: MARKS when the stream can show them, else ASCII_MARKS

    def mark(self, status: str) -> str:
        if self.marks is None:
            self.marks = MARKS if shows_marks(self.stream) else ASCII_MARKS
        return self.marks.get(status, self.marks["failed"])

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, verbosity: int = 0, stream: IO[str] | None = None) -> Logger:
        """The logger of an invocation in `env`: GitHub Actions or not, the secrets of SECRET_ENV masked."""
        summary = env.get("GITHUB_STEP_SUMMARY")
        log = cls(
            verbosity=verbosity,
            stream=stream or sys.stderr,
            github=env.get("GITHUB_ACTIONS") == "true",
            step_summary=Path(summary) if summary else None,
        )
        for name in SECRET_ENV:
            log.mask(env.get(name))
        return log

    # -- secrets ------------------------------------------------------------
    def mask(self, secret: str | None) -> None:
        if secret and len(secret) >= 4:
            self._secrets.add(secret)
            if self.github:
                self._emit(f"::add-mask::{secret}", raw=True)

    def redact(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    # -- files --------------------------------------------------------------
    def attach(self, run_dir: Path) -> None:
        """Start writing the full log into `run_dir/pipeline.log`."""
        run_dir.mkdir(parents=True, exist_ok=True)
        self.close()
        self.log_file = run_dir / "pipeline.log"
        self._fh = self.log_file.open("a", encoding="utf-8")

    def close(self) -> None:
        if self._fh:
            with contextlib.suppress(OSError):  # the last flush on a full disk
                self._fh.close()
            self._fh = None

    def _write_file(self, line: str) -> None:
        if self._fh:
            try:
                self._fh.write(time.strftime("%H:%M:%S ") + self.redact(line) + "\n")
                self._fh.flush()
            except OSError as e:  # a full disk must not turn every log line into a crash
                self.file_error = e
                fh, self._fh = self._fh, None
                with contextlib.suppress(OSError):
                    fh.close()
                self._emit(f"warning: stopped writing {self.log_file}: {e.strerror}")

    def _emit(self, line: str, *, raw: bool = False) -> None:
        self.stream.write((line if raw else self.redact(line)) + "\n")
        self.stream.flush()

    # -- levels -------------------------------------------------------------
    def debug(self, msg: str) -> None:
        self._write_file(msg)
        if self.verbosity >= 2:
            self._emit(f"    {msg}")

    def detail(self, msg: str) -> None:
        """Shown with -v; always in the log file."""
        self._write_file(msg)
        if self.verbosity >= 1:
            self._emit(f"  {msg}")

    def info(self, msg: str) -> None:
        self._write_file(msg)
        self._emit(msg)

    def warn(self, msg: str) -> None:
        self._write_file("WARNING: " + msg)
        self._emit(f"::warning::{msg}" if self.github else f"warning: {msg}")

    def error(self, msg: str, *, file: str | None = None, line: int | None = None) -> None:
        self._write_file("ERROR: " + msg)
        if self.github:
            loc = ""
            if file:
                loc = f" file={file}" + (f",line={line}" if line else "")
            self._emit(f"::error{loc}::{self.redact(msg).replace(chr(10), '%0A')}", raw=True)
        else:
            self._emit(f"error: {msg}")

    def report(self, err: PipelineError) -> int:
        """How an invocation ends on `err` (the CLI's one way): its paragraph, the evidence in
        the log file only; returns its exit code."""
        if err.evidence:
            self.debug("evidence:\n" + err.evidence)
        self.error(str(err))
        if self.log_file is not None:
            self._emit(f"full log: {self.log_file}", raw=True)
        return int(err.exit_code)

    # -- stages -------------------------------------------------------------
    @contextmanager
    def stage(self, name: str, title: str = "") -> Iterator[StageRecord]:
        """Time a stage; print `✓ name (1.2s)` or `✕ name (1.2s)`."""
        rec = StageRecord(name)
        self.stages.append(rec)
        start = time.monotonic()
        self._write_file(f"=== stage {name} {title}".rstrip())
        if self.github:
            self._emit(f"::group::{name}{': ' + title if title else ''}")
        elif self.verbosity >= 1:
            self._emit(f"{self.mark('running')} {name}{': ' + title if title else ''}")
        try:
            yield rec
        except BaseException as e:
            # Ctrl-C or SIGTERM (cli turns it into KeyboardInterrupt) stops a stage; it did not fail
            rec.status = "stopped" if isinstance(e, KeyboardInterrupt) else "failed"
            rec.seconds = time.monotonic() - start
            if self.github:
                self._emit("::endgroup::")
            reason = str(e) if isinstance(e, PipelineError) else type(e).__name__
            self._write_file(f"=== stage {name} {rec.status} after {rec.seconds:.1f}s: {reason}")
            self._emit(f"{self.mark(rec.status)} {name} ({rec.seconds:.1f}s)")
            raise
        else:
            if rec.status == "running":
                rec.status = "ok"
            rec.seconds = time.monotonic() - start
            if self.github:
                self._emit("::endgroup::")
            figure = f" — {rec.figure}" if rec.figure else ""
            self._write_file(f"=== stage {name} {rec.status} in {rec.seconds:.1f}s{figure}")
            mark = self.mark(rec.status)
            figure = f"{' — ' if self.marks is MARKS else ' - '}{rec.figure}" if rec.figure else ""
            self._emit(f"{mark} {name} ({rec.seconds:.1f}s){figure}")

    def summary_markdown(self, title: str) -> str:
        rows = ["| stage | status | duration | figure |", "|---|---|---|---|"]
        for r in self.stages:
            rows.append(f"| {r.name} | {r.status} | {r.seconds:.1f}s | {r.figure} |")
        return f"### {title}\n\n" + "\n".join(rows) + "\n"

    def publish_summary(self, title: str, extra: str = "") -> None:
        """Append the stage table (and `extra` Markdown) to $GITHUB_STEP_SUMMARY."""
        if self.step_summary:
            with self.step_summary.open("a", encoding="utf-8") as f:
                f.write(self.redact(self.summary_markdown(title) + ("\n" + extra if extra else "")) + "\n")
