"""A repeated plain `pipeline check` replays its recorded answer (pipeline/replay.py), and only then.

Whole processes on fixture repositories: the replay is a start-up path, so it is
observed as one (`-X importtime` says whether the checker was loaded at all).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.compat_repos import CompatRepos, build_compat_repos
from tests.fixtures.gitfixture import commit_all, write_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("replay") / "fx")


def _check(
    cwd: Path, fx: CompatRepos, atom: str, aiter: str, *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """(the process, whether it ran the check: through the CLI, or without it (`pipeline.plaincheck`),
    the checker is imported; a replay imports none of it)."""
    argv = [
        sys.executable, "-X", "importtime", "-m", "pipeline", "check", "--atom-repo", str(fx.atom),
        "--aiter-repo", str(fx.aiter), "--atom", atom, "--aiter", aiter, *extra,
    ]  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "GITHUB_"))}
    base.update(PYTHONPATH=str(ROOT), PIPELINE_CACHE_DIR=str(cwd / "cache"), **(env or {}))
    p = subprocess.run(argv, cwd=cwd, env=base, capture_output=True, text=True, check=False)
    imports = [line for line in p.stderr.splitlines() if line.startswith("import time:")]
    p.stderr = "\n".join(line for line in p.stderr.splitlines() if not line.startswith("import time:"))
    return p, any(line.rstrip().endswith(" pipeline.compat.checker") for line in imports)


def _records(cwd: Path) -> list[Path]:
    return sorted((cwd / "cache" / "compat" / "replay").glob("*/*"))


def test_a_repeat_replays_the_answer_without_the_cli(fx: CompatRepos, tmp_path: Path) -> None:
    first, full = _check(tmp_path, fx, fx.t["T1"], fx.a["A4"], "--format", "json")
    assert first.returncode == 4 and full  # incompatible: an answer, recorded
    assert len(_records(tmp_path)) == 1
    again, full_again = _check(tmp_path, fx, fx.t["T1"], fx.a["A4"], "--format", "json")
    assert not full_again
    assert again.returncode == 4 and again.stdout == first.stdout
    # the same lines, with the stage's own time
    assert [ln for ln in again.stderr.splitlines() if "✕ check (" not in ln] == [
        ln for ln in first.stderr.splitlines() if "✕ check (" not in ln
    ]
    (line,) = [ln for ln in again.stderr.splitlines() if ln.startswith("✕ check (")]
    (recorded,) = [ln for ln in first.stderr.splitlines() if ln.startswith("✕ check (")]
    assert re.fullmatch(r"✕ check \(\d+\.\ds\) — .+", line)
    assert line.split(") — ", 1)[1] == recorded.split(") — ", 1)[1]  # only the time is the replay's own


def test_another_question_runs_in_full(fx: CompatRepos, tmp_path: Path) -> None:
    _check(tmp_path, fx, fx.t["T1"], fx.a["A4"])
    other_format, full = _check(tmp_path, fx, fx.t["T1"], fx.a["A4"], "--format", "sarif")
    assert full and other_format.returncode == 4
    compatible, full = _check(tmp_path, fx, fx.t["T2"], fx.a["A4"])
    assert full and compatible.returncode == 0
    replayed, full = _check(tmp_path, fx, fx.t["T2"], fx.a["A4"])
    assert not full and replayed.returncode == 0 and replayed.stdout == compatible.stdout
    off, full = _check(tmp_path, fx, fx.t["T2"], fx.a["A4"], env={"PIPELINE_REPLAY": "0"})
    assert full and off.stdout == compatible.stdout
    setting, full = _check(tmp_path, fx, fx.t["T2"], fx.a["A4"], env={"PIPELINE_FETCH_RETRIES": "5"})
    assert full and setting.returncode == 0
    _, full = _check(tmp_path, fx, fx.t["T2"], fx.a["A4"], "--no-waivers")
    assert full  # not the plain form: never replayed


def test_a_moved_aiter_tip_is_a_new_question(tmp_path: Path) -> None:
    # aiter's tip is read for the callees' histories: a new commit there changes the key.
    fx = build_compat_repos(tmp_path / "fx")
    work = tmp_path / "work"
    work.mkdir()
    _check(work, fx, fx.t["T1"], fx.a["A4"])
    _, full = _check(work, fx, fx.t["T1"], fx.a["A4"])
    assert not full
    write_files(fx.aiter, {"NOTES.md": "later\n"})
    commit_all(fx.aiter, "later: docs", "2026-06-01T10:00:00+00:00")
    after, full = _check(work, fx, fx.t["T1"], fx.a["A4"])
    assert full and after.returncode == 4


def test_errors_are_never_recorded(fx: CompatRepos, tmp_path: Path) -> None:
    bad, full = _check(tmp_path, fx, "no-such-ref", fx.a["A4"])
    assert full and bad.returncode == 3 and "Traceback" not in bad.stderr
    assert _records(tmp_path) == []
    again, full = _check(tmp_path, fx, "no-such-ref", fx.a["A4"])
    assert full and again.returncode == 3


def test_the_key_asks_both_repositories_at_once(fx: CompatRepos, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both `git rev-parse`s run side by side (each is a process start on the way to the answer);
    a ref that does not resolve gives no key, and no git is left unwaited."""
    from pipeline import replay

    seen: list[str] = []
    spawn, read, wait = os.posix_spawnp, os.read, os.waitpid

    def spy_spawn(*a: object, **k: object) -> int:
        seen.append("spawn")
        return spawn(*a, **k)  # type: ignore[arg-type]

    def spy_read(fd: int, n: int) -> bytes:
        seen.append("read")
        return read(fd, n)

    waited: list[int] = []

    def spy_wait(pid: int, options: int) -> tuple[int, int]:
        waited.append(pid)
        return wait(pid, options)

    monkeypatch.setattr(replay.os, "posix_spawnp", spy_spawn)
    monkeypatch.setattr(replay.os, "read", spy_read)
    monkeypatch.setattr(replay.os, "waitpid", spy_wait)
    got = replay._git_lines([(str(fx.atom), ["HEAD"]), (str(fx.aiter), [fx.a["A1"], "HEAD"])], os.environ)
    assert got is not None and [len(x) for x in got] == [1, 2] and got[1][0] == fx.a["A1"]
    assert seen[:2] == ["spawn", "spawn"]
    assert replay._git_lines([(str(fx.atom), ["no-such-ref"]), (str(fx.aiter), ["HEAD"])], os.environ) is None
    assert len(waited) == 4
