"""The seven stages, in order, behind one shape (see `pipeline/stages/base.py`).

    pin → patch → check → render → build → smoke → tag

`TABLE` is the one registry: the orchestrator (`pipeline build --model`) walks it
in order, and the CLI (`pipeline <stage>`) finds each stage's command and help
line in it. Stage modules are imported only when used, so `pipeline --help` and
one stage's command never import another stage's heavy dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from pipeline.stages.base import Context, StageData, Upstream
    from pipeline.stages.spec import BuildSpec

STAGE_ORDER: tuple[str, ...] = ("pin", "patch", "check", "render", "build", "smoke", "tag")


class Stage(Protocol):
    """What a stage module provides (a module satisfies this protocol)."""

    NAME: str
    STOPS: tuple[type[Exception], ...]

    @property
    def Inputs(self) -> type[StageData]: ...

    @property
    def Outputs(self) -> type[StageData]: ...

    def plan(self, ctx: Context, spec: BuildSpec, up: Upstream) -> Any: ...

    def reads(self, ctx: Context, inputs: Any) -> Iterable[Path]: ...

    def run(self, ctx: Context, inputs: Any) -> Any: ...


class Entry(NamedTuple):  # not a dataclass: `pipeline --help` reads this table without importing dataclasses
    """One row of the table: the stage's module and its one-line help (for `pipeline --help`).

    `stage` holds an already loaded stage (tests register fake stages that way).
    """

    name: str
    module: str
    help: str
    stage: Stage | None = None

    def load(self) -> Stage:
        if self.stage is not None:
            return self.stage
        mod: Stage = importlib.import_module(self.module)
        return mod


class Table(Mapping[str, Entry]):
    """Stage name → Entry, in stage order."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self._entries = {e.name: e for e in entries}

    def __getitem__(self, name: str) -> Entry:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def order(self) -> tuple[str, ...]:
        return tuple(self._entries)


TABLE = Table(
    Entry(name, f"pipeline.stages.{name}", help)
    for name, help in (
        ("pin", "Resolve ATOM and aiter refs to full SHAs and write the lock file."),
        ("patch", "The ATOM patch series: list, check, apply (the final lock), new/export/import, draft."),
        ("check", "Check every ATOM call of an aiter function against aiter's signatures."),
        ("render", "Render the Dockerfile and build context from the templates."),
        ("build", "Run the whole chain for a model, or build one rendered context."),
        ("smoke", "Smoke-test an image with a model recipe on MI355 GPUs."),
        ("tag", "Tag and push a verified image by digest."),
    )
)
