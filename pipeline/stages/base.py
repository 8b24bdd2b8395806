"""The one stage shape: typed, frozen `Inputs`/`Outputs`, one `run(ctx, inputs) -> Outputs`.

A stage module (pipeline/stages/<name>.py) defines

    NAME                          its name in STAGE_ORDER
    Inputs, Outputs               frozen pydantic models (`StageData`); nothing untyped between stages
    plan(ctx, spec, up) -> Inputs  the Inputs of a `pipeline build` run: from the spec and the
                                  Outputs of the stages before it (`up`)
    reads(ctx, inputs) -> paths   the files and directories it reads (templates, recipe, patches)
    run(ctx, inputs) -> Outputs   the work; `pipeline <stage>` calls this same function
    STOPS                         error classes that stop a run without failing it (e.g. no GPUs)

The inputs digest of a stage is computed here, from its Inputs and the content of
what it reads, so no stage keeps a hand-written list of what it depends on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict

from pipeline.errors import UsageError

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.log import Logger
    from pipeline.oci.engine import EngineAPI

DIGEST_SCHEMA = 2


class StageData(BaseModel):
    """Base of every stage's Inputs and Outputs: frozen, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=False)

    def figure(self) -> str:
        """The key figure shown in the stage table (Outputs override it)."""
        return ""


@dataclass
class Context:
    """What every stage's `run` receives: resolved settings, the log, the environment, a work dir.

    `work_dir` is the run directory (`pipeline build`) or the command's own run
    directory; `resume_command` is set by the orchestrator so a stage that stops
    the run can say how to go on.
    """

    settings: Settings
    log: Logger
    env: Mapping[str, str]
    work_dir: Path
    resume_command: str | None = None
    _engine: EngineAPI | None = field(default=None, repr=False)
    _engine_host: str | None = field(default=None, repr=False)

    def settings_with(self, **sections: Mapping[str, Any]) -> Settings:
        """The settings with the values a stage's Inputs carry put back, section by section.

        A stage's Inputs are what its digest covers (and what `--resume` replays), so a setting
        recorded there, e.g. `settings_with(tag={"registry": inputs.registry})`, wins over the
        configuration the Context was opened with.
        """
        update = {
            name: getattr(self.settings, name).model_copy(update=dict(values))
            for name, values in sections.items()
        }
        return self.settings.model_copy(update=update)

    def engine(self, docker_host: str | None = None) -> EngineAPI:
        """The Docker engine, opened once: `docker_host` (a stage's Inputs record it), else
        [smoke] docker_host, else DOCKER_HOST or the local socket."""
        host = docker_host or self.settings.smoke.docker_host or None
        if self._engine is not None and self._engine_host != host:
            self.close()
        if self._engine is None:
            from pipeline.oci.engine import Engine

            self._engine = Engine.connect(host, env=self.env, log=self.log)
            self._engine_host = host
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


T = TypeVar("T", bound=StageData)


class Upstream:
    """The Outputs of the stages before this one in a run, by stage name."""

    def __init__(self, outputs: Mapping[str, StageData] | None = None) -> None:
        self._outputs: dict[str, StageData] = dict(outputs or {})

    def __contains__(self, name: str) -> bool:
        return name in self._outputs

    def set(self, name: str, outputs: StageData) -> None:
        self._outputs[name] = outputs

    def get(self, name: str, kind: type[T]) -> T:
        out = self._outputs.get(name)
        if out is None:
            raise UsageError(
                f"this stage needs the result of the {name} stage, which this run has not produced.",
                hint=f"Run the {name} stage first: drop --from, or resume a run that got past {name}.",
            )
        if not isinstance(out, kind):
            raise TypeError(f"{name} outputs are {type(out).__name__}, not {kind.__name__}")
        return out


def _content_digest(path: Path) -> str:
    """sha256 over a file, or over every file under a directory (names included); 'absent' if none."""
    if path.is_file():
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(path.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(p.relative_to(path).as_posix().encode() + b"\0")
                h.update(_content_digest(p).encode() + b"\0")
        return h.hexdigest()
    return "absent"


@dataclass(frozen=True)
class InputsRecord:
    """What a stage record keeps of its inputs: the digest, and what it was computed over (so a
    stage that runs again can say which input changed)."""

    digest: str
    inputs: dict[str, Any]
    reads: dict[str, str]  # path -> content digest

    def changes(self, old_inputs: Mapping[str, Any], old_reads: Mapping[str, str]) -> list[str]:
        """What differs from an earlier record, one phrase each: the field or the file, old and new."""
        out = []
        for key in sorted(self.inputs.keys() | old_inputs.keys()):
            before, now = old_inputs.get(key), self.inputs.get(key)
            if before != now:
                out.append(f"input {key} changed ({_brief(before)} → {_brief(now)})")
        for path in sorted(self.reads.keys() | old_reads.keys()):
            before_d, now_d = old_reads.get(path, "absent"), self.reads.get(path, "absent")
            if before_d != now_d:
                out.append(f"{path} changed ({before_d[:12]} → {now_d[:12]})")
        return out


def _brief(value: Any) -> str:
    """A value short enough for one line (a lock or a dict is shown by its digest)."""
    text = json.dumps(value, sort_keys=True, default=str)
    if len(text) <= 60:
        return text
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:12]


RUN = "$RUN"  # a path inside the run directory, as records keep it (the directory may move)


def portable(value: Any, root: Path | None) -> Any:
    """`value` (JSON) with every path inside `root` written from `$RUN`: a run directory copied to
    another host (or place) keeps its digests and records."""
    if root is None:
        return value
    prefixes = {str(root), str(root.absolute())}
    if isinstance(value, str):
        for prefix in prefixes:
            if value == prefix or value.startswith(prefix + "/"):
                return RUN + value[len(prefix) :]
        return value
    if isinstance(value, dict):
        return {portable(k, root): portable(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v, root) for v in value]
    return value


def local(value: Any, root: Path) -> Any:
    """The inverse of `portable`: `$RUN` read as this run directory."""
    if isinstance(value, str):
        return str(root) + value[len(RUN) :] if value == RUN or value.startswith(RUN + "/") else value
    if isinstance(value, dict):
        return {k: local(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [local(v, root) for v in value]
    return value


def inputs_record(
    name: str, inputs: StageData, reads: Iterable[Path], root: Path | None = None
) -> InputsRecord:
    """The digest a stage record is keyed by: its Inputs plus the content of what it reads (paths
    inside the run directory `root` written from `$RUN`)."""
    dumped = portable(inputs.model_dump(mode="json"), root)
    read = {portable(str(p), root): _content_digest(p) for p in reads}
    data: dict[str, Any] = {"schema": DIGEST_SCHEMA, "stage": name, "inputs": dumped, "reads": read}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return InputsRecord(hashlib.sha256(blob).hexdigest(), dumped, read)


def inputs_digest(name: str, inputs: StageData, reads: Iterable[Path]) -> str:
    return inputs_record(name, inputs, reads).digest
