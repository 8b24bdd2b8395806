"""Run directories: where one `pipeline build` keeps everything it did.

    runs/<yyyymmdd-HHMMSS>-<model>-<id>/
      run.json            the resolved build spec (model, settings, refs)
      pipeline.log        the full log
      lock.toml           the lock this run built from (patches included)
      stages/<name>.json  each stage's status, inputs digest, outputs, duration
      ...                 stage files: check.json/sarif, context/, build.log, verdict.json, record.json

A stage whose record says `ok` with the same inputs digest is skipped on
resume; a failed stage is where a resumed run starts. A `filelock` on the
run directory keeps two processes from driving the same run.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import UsageError
from pipeline.fsutil import acquire_lock, atomic_write_json, read_text

if TYPE_CHECKING:
    from filelock import BaseFileLock

STAGE_ORDER: tuple[str, ...] = ("pin", "check", "patch", "render", "build", "smoke", "tag")


def inputs_digest(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass
class StageState:
    name: str
    status: str  # ok | failed | skipped-no-hardware
    inputs_digest: str
    outputs: dict[str, Any]
    seconds: float
    error: str = ""


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.stages_dir = path / "stages"
        self._lock: BaseFileLock | None = None

    @classmethod
    def new(cls, runs_dir: Path, model: str) -> RunDir:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = runs_dir / f"{stamp}-{model}-{secrets.token_hex(3)}"
        path.mkdir(parents=True, exist_ok=False)
        return cls(path)

    @classmethod
    def existing(cls, path: Path) -> RunDir:
        if not (path / "run.json").is_file():
            raise UsageError(
                f"{path} is not a pipeline run directory (no run.json).",
                hint="Pass the directory a previous `pipeline build` printed, e.g. runs/20261129-...-abc123.",
            )
        return cls(path)

    def acquire(self) -> None:
        self._lock = acquire_lock(
            self.path / ".run.lock",
            wait=0.5,
            busy=f"another pipeline process is driving {self.path}.",
            hint="Wait for it to finish, or start a new run without --resume.",
        )

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- spec and stage records ----------------------------------------------
    def write_spec(self, spec: dict[str, Any]) -> None:
        atomic_write_json(self.path / "run.json", spec)

    def read_spec(self) -> dict[str, Any]:
        return _read_json(self.path / "run.json")

    def record(self, state: StageState) -> None:
        atomic_write_json(self.stages_dir / f"{state.name}.json", state.__dict__)

    def state(self, name: str) -> StageState | None:
        p = self.stages_dir / f"{name}.json"
        if not p.is_file():
            return None
        data = _read_json(p)
        try:
            return StageState(**data)
        except TypeError:
            raise UsageError(
                f"stage record {p} is not one this pipeline wrote.", hint="Start a new run without --resume."
            ) from None


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object the run wrote; a damaged one is a clear error, not a traceback."""
    hint = "Start a new run without --resume."
    text = read_text(path, what="run record", hint=hint)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"run record {path} is not valid JSON: {e}.", hint=hint) from None
    if not isinstance(data, dict):
        raise UsageError(f"run record {path} is not a JSON object.", hint=hint)
    return data
