"""The orchestrator's skip/resume/stop loop, with fake stages registered in a table (no git, no docker)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.config import load_settings
from pipeline.errors import BuildError, NoHardware, UsageError
from pipeline.log import Logger
from pipeline.orchestrate import drive
from pipeline.runs import RunDir
from pipeline.stages import Entry, Table
from pipeline.stages.base import Context, StageData, Upstream
from pipeline.stages.spec import BuildSpec


class FakeInputs(StageData):
    before: str  # the previous stage's output
    knob: str  # a setting the stage uses


class FakeOutputs(StageData):
    value: str

    def figure(self) -> str:
        return self.value


@dataclass
class FakeStage:
    """A stage that reads one file and appends its content to the previous stage's output."""

    NAME: str
    previous: str | None
    file: Path
    calls: list[str]
    fail_with: Exception | None = None
    knob: str = "k1"
    STOPS: tuple[type[Exception], ...] = (NoHardware,)
    Inputs: type[StageData] = FakeInputs
    Outputs: type[StageData] = FakeOutputs
    seen: list[FakeInputs] = field(default_factory=list)

    def plan(self, ctx: Context, spec: BuildSpec, up: Upstream) -> FakeInputs:
        before = up.get(self.previous, FakeOutputs).value if self.previous else spec.model
        return FakeInputs(before=before, knob=self.knob)

    def reads(self, ctx: Context, inputs: FakeInputs) -> Iterable[Path]:
        return [self.file]

    def run(self, ctx: Context, inputs: FakeInputs) -> FakeOutputs:
        self.calls.append(self.NAME)
        if self.fail_with is not None:
            raise self.fail_with
        return FakeOutputs(value=f"{inputs.before}+{self.file.read_text()}")


@dataclass
class World:
    stages: dict[str, FakeStage]
    table: Table
    calls: list[str]
    rd: RunDir
    ctx: Context

    def spec(self, stages: tuple[str, ...] = ("a", "b", "c")) -> BuildSpec:
        return BuildSpec(
            model="M",
            recipe_path=Path("recipes/M.yaml"),
            atom_repo="atom",
            aiter_repo="aiter",
            atom_ref="main",
            aiter_ref="main",
            base_image=None,
            lock_path=None,
            stages=stages,
            registry="",
            repository="r",
        )

    def states(self) -> dict[str, str]:
        return {n: s.status for n in self.stages if (s := self.rd.state(n)) is not None}


@pytest.fixture
def world(tmp_path: Path) -> World:
    calls: list[str] = []
    stages = {}
    previous = None
    for name in ("a", "b", "c"):
        f = tmp_path / f"{name}.txt"
        f.write_text(name)
        stages[name] = FakeStage(name, previous, f, calls)
        previous = name
    table = Table(Entry(n, "", "", stage=s) for n, s in stages.items())  # type: ignore[arg-type]
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    settings = load_settings(env={}, cwd=tmp_path)
    ctx = Context(settings=settings, log=Logger(stream=io.StringIO()), env={}, work_dir=run)
    return World(stages, table, calls, RunDir(run), ctx)


def test_runs_in_table_order_then_skips_what_is_done(world: World) -> None:
    result = drive(world.ctx, world.spec(), world.rd, world.table)
    assert result.error is None and world.calls == ["a", "b", "c"]
    assert world.states() == {"a": "ok", "b": "ok", "c": "ok"}
    out = result.output("c", FakeOutputs)
    assert out is not None and out.value == "M+a+b+c"

    world.calls.clear()
    again = drive(world.ctx, world.spec(), world.rd, world.table)
    assert world.calls == [] and again.output("c", FakeOutputs) == out
    assert [r.status for r in world.ctx.log.stages[-3:]] == ["skipped"] * 3


@pytest.mark.parametrize(("changed", "rerun"), [("a", ["a", "b", "c"]), ("b", ["b", "c"]), ("c", ["c"])])
def test_a_changed_input_file_reruns_its_stage_and_those_after_it(
    world: World, changed: str, rerun: list[str]
) -> None:
    drive(world.ctx, world.spec(), world.rd, world.table)
    world.calls.clear()
    world.stages[changed].file.write_text(changed + "-edited")
    drive(world.ctx, world.spec(), world.rd, world.table)
    assert world.calls == rerun


def test_a_changed_setting_in_the_inputs_reruns_the_stage_and_only_what_its_outputs_change(
    world: World,
) -> None:
    drive(world.ctx, world.spec(), world.rd, world.table)
    world.calls.clear()
    world.stages["b"].knob = "k2"
    drive(world.ctx, world.spec(), world.rd, world.table)
    assert world.calls == ["b"]  # b's Outputs do not depend on the knob: c's Inputs are the same


def test_a_failure_ends_the_run_and_resume_starts_there(world: World) -> None:
    world.stages["b"].fail_with = BuildError("the build broke")
    result = drive(world.ctx, world.spec(), world.rd, world.table)
    assert isinstance(result.error, BuildError) and world.calls == ["a", "b"]
    assert world.states() == {"a": "ok", "b": "failed"}

    world.calls.clear()
    world.stages["b"].fail_with = None
    result = drive(world.ctx, world.spec(), world.rd, world.table)
    assert result.error is None and world.calls == ["b", "c"]


def test_a_refused_edit_that_is_restored_leaves_the_stage_done_earlier(world: World) -> None:
    """A stage done, its input edited: it runs again and refuses (a lock edited on a GPU host that
    cannot render). The edit undone, the stage is done earlier again, not run (it could not be)."""
    drive(world.ctx, world.spec(), world.rd, world.table)
    good = world.rd.state("b")
    world.calls.clear()
    world.stages["b"].file.write_text("b-edited")
    world.stages["b"].fail_with = UsageError("refused: b.txt was edited")
    result = drive(world.ctx, world.spec(), world.rd, world.table)
    assert isinstance(result.error, UsageError) and world.calls == ["b"]
    assert world.states() == {"a": "ok", "b": "failed", "c": "ok"}
    result = drive(world.ctx, world.spec(), world.rd, world.table)  # still edited: refused again
    assert isinstance(result.error, UsageError) and world.calls == ["b", "b"]

    world.calls.clear()
    world.stages["b"].file.write_text("b")  # restored
    result = drive(world.ctx, world.spec(), world.rd, world.table)
    assert result.error is None and world.calls == []
    assert world.rd.state("b") == good and world.states() == {"a": "ok", "b": "ok", "c": "ok"}
    assert [r.status for r in world.ctx.log.stages[-3:]] == ["skipped"] * 3


def test_a_refused_edit_undone_before_a_range_that_starts_after_it_is_done_earlier(world: World) -> None:
    """`--from c` after b refused an edit that was then undone: b's kept record is its result."""
    drive(world.ctx, world.spec(), world.rd, world.table)
    world.stages["b"].file.write_text("b-edited")
    world.stages["b"].fail_with = UsageError("refused: b.txt was edited")
    drive(world.ctx, world.spec(), world.rd, world.table)
    world.calls.clear()
    world.stages["b"].file.write_text("b")  # restored
    result = drive(world.ctx, world.spec(("c",)), world.rd, world.table)
    assert result.error is None and world.calls == [] and world.states()["b"] == "ok"
    world.stages["b"].file.write_text("b-edited")  # not undone: b has no result for c
    drive(world.ctx, world.spec(), world.rd, world.table)
    result = drive(world.ctx, world.spec(("c",)), world.rd, world.table)
    assert result.error is not None and "needs the result of the b stage" in result.error.message


def test_an_error_the_stage_lists_in_stops_stops_the_run_without_failing_it(world: World) -> None:
    world.stages["b"].fail_with = NoHardware("no GPUs here")
    result = drive(world.ctx, world.spec(), world.rd, world.table)
    assert isinstance(result.error, NoHardware) and world.states() == {"a": "ok", "b": "stopped"}
    assert world.calls == ["a", "b"]


def test_a_range_reads_earlier_outputs_from_the_record(world: World) -> None:
    drive(world.ctx, world.spec(("a",)), world.rd, world.table)
    world.calls.clear()
    result = drive(world.ctx, world.spec(("b", "c")), world.rd, world.table)
    assert world.calls == ["b", "c"]
    out = result.output("c", FakeOutputs)
    assert out is not None and out.value == "M+a+b+c"


def test_a_stage_whose_upstream_never_ran_fails_with_a_clear_message(world: World) -> None:
    result = drive(world.ctx, world.spec(("b", "c")), world.rd, world.table)
    assert isinstance(result.error, UsageError) and "needs the result of the a stage" in str(result.error)
    assert world.calls == [] and world.states() == {"b": "failed"}
