"""Two runs updating one lock file: the second is told (exit 13), never silently overwritten."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ExitCode, LockFileError, RunLocked
from pipeline.fsutil import hold_lock
from pipeline.lock import BaseImagePin, Lock, SourcePin, Sources, guard_path, updating


def make_lock(sha: str = "a" * 40) -> Lock:
    pin = SourcePin(url="file:///x", ref="main", sha=sha, date="2026-06-24T09:00:00Z", subject="s")
    aiter = SourcePin(url="file:///y", ref="main", sha="b" * 40, date="2026-06-23T10:09:28Z", subject="t")
    return Lock(model="M", sources=Sources(atom=pin, aiter=aiter), base_image=BaseImagePin(ref="base:1"))


def test_a_lock_changed_since_it_was_read_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "M.toml"
    make_lock().save(path)
    Lock.load(path)  # this run reads it
    theirs = make_lock("c" * 40).to_toml()
    path.write_text(theirs)  # another run's pin, between our read and our write

    with pytest.raises(RunLocked, match="changed by another run") as e:
        make_lock("d" * 40).save(path)
    assert e.value.exit_code == ExitCode.LOCKED
    assert path.read_text() == theirs  # nothing written
    assert not guard_path(path).exists()  # and no guard file left


def test_a_second_update_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "M.toml"
    make_lock().save(path)
    with hold_lock(guard_path(path), wait=0, busy="x", hint="y"):  # another run holds it
        with pytest.raises(RunLocked, match="another `pipeline` run is updating") as e, updating(path):
            pass
        assert e.value.exit_code == ExitCode.LOCKED


def test_update_yields_the_current_lock_and_saves_through_its_own_guard(tmp_path: Path) -> None:
    path = tmp_path / "M.toml"
    with updating(path) as previous:
        assert previous is None
        assert make_lock().save(path) is True  # re-entrant: our own guard does not block us
        assert guard_path(path).exists()
    assert not guard_path(path).exists()
    with updating(path) as previous:
        assert previous == make_lock()
        assert make_lock().save(path) is False  # unchanged: a no-op


def test_lock_path_that_is_a_directory_is_refused_before_anything_runs(tmp_path: Path) -> None:
    d = tmp_path / "M.toml"
    d.mkdir()
    with pytest.raises(LockFileError, match="is a directory"), updating(d):
        pass
