"""The default retention: a command that opens a run keeps only the newest [paths] keep_runs runs."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from pipeline.app import App
from pipeline.config import load_settings
from pipeline.fsutil import acquire_lock
from pipeline.gc import plan, prune_runs
from pipeline.log import Logger


def _runs(tmp_path: Path, n: int) -> list[Path]:
    runs = []
    for i in range(n):
        run = tmp_path / "runs" / f"run-{i}"
        run.mkdir(parents=True)
        (run / "pipeline.log").write_text("x")
        for p in (run / "pipeline.log", run):
            os.utime(p, (1_000_000 + i * 60, 1_000_000 + i * 60))  # run-0 oldest
        runs.append(run)
    return runs


def test_runs_beyond_the_newest_keep_runs_go_but_a_held_one_stays(tmp_path: Path) -> None:
    runs = _runs(tmp_path, 6)
    held = acquire_lock(runs[0] / ".run.lock", wait=0, busy="held", hint="")
    for p in (runs[0] / ".run.lock", runs[0]):
        os.utime(p, (1_000_000, 1_000_000))  # still the oldest
    env = {"PIPELINE_RUNS_DIR": str(tmp_path / "runs"), "PIPELINE_KEEP_RUNS": "3"}
    settings = load_settings(env=env, cwd=tmp_path)
    listed = plan(settings, older_than_days=30, keep_newest=3, now=1_000_000 + 7 * 60)
    assert sorted(i.path.name for i in listed.items) == ["run-1", "run-2"]
    assert all(i.detail == "beyond the newest 3" for i in listed.items)
    out = io.StringIO()
    try:
        assert prune_runs(settings, Logger(stream=out), now=1_000_000 + 7 * 60) == 2
    finally:
        held.release()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run-0", "run-3", "run-4", "run-5"]
    assert "removed 2 old run directories" in out.getvalue() and "keep_runs" in out.getvalue()


def test_a_command_opening_a_run_applies_the_retention_and_zero_keeps_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _runs(tmp_path, 4)
    env = {"PIPELINE_RUNS_DIR": str(tmp_path / "runs"), "PIPELINE_KEEP_RUNS": "2"}
    app = App.create(config_file=None, verbosity=0, env=env)
    app.log.stream = io.StringIO()
    monkeypatch.chdir(tmp_path)
    new = app.open_run("pin-M")
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == sorted(["run-2", "run-3", new.name])
    keep_all = load_settings(env={**env, "PIPELINE_KEEP_RUNS": "0"}, cwd=tmp_path)
    assert prune_runs(keep_all, Logger(stream=io.StringIO())) == 0
