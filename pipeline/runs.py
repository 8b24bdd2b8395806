"""Run directories: where one `pipeline build` keeps everything it did.

    runs/<yyyymmdd-HHMMSS>-<model>-<id>/
      run.json            the resolved build spec (model, recipe, refs, stages)
      pipeline.log        the full log
      lock.toml           the lock this run built from (patches included)
      stages/<name>.json  each stage's status, inputs digest, outputs, duration
      ...                 stage files: check.json/sarif, context/, build.log, verdict.json, record.json

A stage whose record says `ok` with the same inputs digest is skipped on
resume; a failed stage is where a resumed run starts. A `filelock` on the
run directory keeps two processes from driving the same run.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipeline.errors import UsageError
from pipeline.fsutil import acquire_lock, atomic_write_json, read_bytes

if TYPE_CHECKING:
    from filelock import BaseFileLock

    from pipeline.stages.spec import BuildSpec

# ok: done (a later run with the same inputs digest skips it); failed: a resumed run starts here;
# stopped: the run ended here without a failure (e.g. no GPUs on this host)
Status = Literal["ok", "failed", "stopped"]


@dataclass
class StageState:
    name: str
    status: Status
    inputs_digest: str
    outputs: dict[str, Any]
    seconds: float
    error: str = ""
    figure: str = ""  # the key figure of the stage table
    inputs: dict[str, Any] = field(default_factory=dict)  # what the digest covers, to say what changed
    reads: dict[str, str] = field(default_factory=dict)
    # the `ok` record a failed re-run replaced: when its inputs are restored it is done again
    # (a GPU host without mirrors cannot render again after refusing an edited lock)
    earlier: dict[str, Any] = field(default_factory=dict)


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
    def write_spec(self, spec: BuildSpec) -> None:
        atomic_write_json(self.path / "run.json", spec.model_dump(mode="json"))

    def read_spec(self) -> BuildSpec:
        from pydantic import ValidationError

        from pipeline.stages.spec import BuildSpec

        path = self.path / "run.json"
        hint = "Start a new run (`pipeline build --model MODEL`) instead of --resume."
        data = read_bytes(path, what="run specification", hint=hint)  # bounded: --resume takes any dir
        try:
            return BuildSpec.model_validate_json(data)
        except ValidationError as e:
            raise UsageError(
                f"{path} cannot be resumed: it is unreadable or was written by another version "
                f"({type(e).__name__}).",
                hint=hint,
            ) from None

    def record(self, state: StageState) -> None:
        atomic_write_json(self.stages_dir / f"{state.name}.json", asdict(state))

    def state(self, name: str) -> StageState | None:
        p = self.stages_dir / f"{name}.json"
        if not p.is_file():
            return None
        try:
            data: dict[str, Any] = json.loads(p.read_text(encoding="utf-8"))
            return StageState(**data)
        except (ValueError, TypeError):
            return None  # an unreadable record: the stage runs again
