"""A run is frozen (issue 27 §1): records that travel, stages that say why they run again, a pin kept."""

from __future__ import annotations

import io
from pathlib import Path

from pipeline.config import load_settings
from pipeline.log import Logger
from pipeline.orchestrate import drive
from pipeline.runs import RunDir
from pipeline.stages import Entry, Table
from pipeline.stages.base import Context, inputs_record, local, portable
from tests.unit.test_orchestrate import FakeInputs, FakeStage, World


def test_paths_inside_the_run_are_written_from_run_and_read_back_anywhere(tmp_path: Path) -> None:
    root = tmp_path / "runs" / "r1"
    data = {
        "context": str(root / "context"),
        "list": [str(root), str(tmp_path / "runs" / "r10" / "x")],  # a sibling with the same prefix
        str(root / "lock.toml"): "key",
        "other": "/srv/patches",
    }
    kept = portable(data, root)
    assert kept == {
        "context": "$RUN/context",
        "list": ["$RUN", str(tmp_path / "runs" / "r10" / "x")],
        "$RUN/lock.toml": "key",
        "other": "/srv/patches",
    }
    elsewhere = tmp_path / "gpu" / "r1"
    assert local(kept["context"], elsewhere) == str(elsewhere / "context")
    assert local(kept, root)["list"] == data["list"]


def test_an_inputs_record_names_the_field_and_the_file_that_changed(tmp_path: Path) -> None:
    f = tmp_path / "patches"
    f.write_text("v1")
    old = inputs_record("s", FakeInputs(before="x", knob="k1"), [f], tmp_path)
    f.write_text("v2")
    new = inputs_record("s", FakeInputs(before="x", knob="k2"), [f], tmp_path)
    assert old.digest != new.digest
    changes = new.changes(old.inputs, old.reads)
    assert changes[0] == 'input knob changed ("k1" → "k2")'
    before, after = old.reads["$RUN/patches"][:12], new.reads["$RUN/patches"][:12]
    assert changes[1] == f"$RUN/patches changed ({before} → {after})"


def _pin_world(tmp_path: Path) -> World:
    calls: list[str] = []
    f = tmp_path / "refs.txt"
    f.write_text("main")
    stages = {"pin": FakeStage("pin", None, f, calls), "b": FakeStage("b", "pin", tmp_path / "b.txt", calls)}
    (tmp_path / "b.txt").write_text("b")
    table = Table(Entry(n, "", "", stage=s) for n, s in stages.items())  # type: ignore[arg-type]
    run = tmp_path / "run"
    run.mkdir()
    ctx = Context(
        settings=load_settings(env={}, cwd=tmp_path), log=Logger(stream=io.StringIO()), env={}, work_dir=run
    )
    return World(stages, table, calls, RunDir(run), ctx)


def test_pin_keeps_its_decision_when_its_inputs_change_and_repin_makes_it_again(tmp_path: Path) -> None:
    w = _pin_world(tmp_path)
    spec = w.spec(("pin", "b"))
    drive(w.ctx, spec, w.rd, w.table)
    assert w.calls == ["pin", "b"]
    w.calls.clear()
    w.stages["pin"].file.write_text("moved")  # what pin would resolve now
    drive(w.ctx, spec, w.rd, w.table)
    assert w.calls == []  # kept: the run's pin
    said = w.ctx.log.stream.getvalue()  # type: ignore[attr-defined]
    assert "refs.txt changed" in said and "the run keeps M+main" in said and "--repin" in said

    drive(w.ctx, spec, w.rd, w.table, repin=True)
    assert w.calls == ["pin", "b"]
    said = w.ctx.log.stream.getvalue()  # type: ignore[attr-defined]
    assert "pin runs again: --repin" in said and "pin again (--repin): M+main → M+moved" in said
