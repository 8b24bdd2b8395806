"""Stage marks and statuses as a user sees them: Ctrl-C is `stopped` (screen, table and record),
and a terminal that cannot show ✓ ✕ ↷ gets ASCII marks."""

from __future__ import annotations

import io

import pytest

from pipeline.log import Logger
from pipeline.orchestrate import drive
from tests.unit.test_orchestrate import World, world

__all__ = ["world"]  # the fixture, shared with test_orchestrate


def test_an_interrupt_stops_the_stage_and_records_it(world: World) -> None:
    world.stages["b"].fail_with = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        drive(world.ctx, world.spec(), world.rd, world.table)
    assert world.states() == {"a": "ok", "b": "stopped"}
    state = world.rd.state("b")
    assert state is not None and state.error == "interrupted"
    assert [r.status for r in world.ctx.log.stages] == ["ok", "stopped"]
    shown = world.ctx.log.stream.getvalue()  # type: ignore[attr-defined]
    assert "■ b (" in shown and "✕" not in shown


class _Ascii(io.StringIO):
    encoding = "ascii"


class _Utf8(io.StringIO):
    encoding = "utf-8"


def test_stage_marks_fall_back_to_ascii_where_they_cannot_show() -> None:
    for stream, ok, failed in ((_Utf8(), "✓ s1 (", "✕ s2 ("), (_Ascii(), "+ s1 (", "x s2 (")):
        log = Logger(stream=stream)
        with log.stage("s1") as rec:
            rec.figure = "done"
        with pytest.raises(RuntimeError), log.stage("s2"):
            raise RuntimeError("boom")
        shown = stream.getvalue()
        assert ok in shown and failed in shown
        shown.encode(stream.encoding)  # nothing the stream cannot write
