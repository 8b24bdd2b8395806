"""Git commands begun early (`GitRepo.soon`): the same output as `GitRepo.git` gives, however large; a
failure is still our error; a command nobody reads is killed when the run closes, and leaves no process."""

from __future__ import annotations

import os
import subprocess

import pytest

from pipeline.compat import checker
from pipeline.errors import SourceError
from pipeline.gitw import STREAM_MIN_BLOBS, GitRepo
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("compat-soon"))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> GitRepo:
    """A repository whose log is far bigger than a pipe's buffer (64 KiB)."""
    root = tmp_path_factory.mktemp("soon-big") / "repo"
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "big.py").write_bytes(b"".join(b"x%d = %d\n" % (i, i) for i in range(40000)))
    env = dict(os.environ, GIT_AUTHOR_NAME="a", GIT_AUTHOR_EMAIL="a@x", GIT_COMMITTER_NAME="a",
               GIT_COMMITTER_EMAIL="a@x")  # fmt: skip
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(root), "commit", "-q", "-m", "big"], check=True, env=env)
    return GitRepo(root)


def test_output_read_later_is_the_output_of_the_command_run_now(big: GitRepo) -> None:
    args = ("log", "-p", "HEAD")
    started = big.soon(*args)
    now = big.git(*args)
    assert len(now) > 200_000  # would fill a pipe nobody reads: a file does not
    assert started.stdout() == now


def test_a_failed_command_begun_early_is_our_error(big: GitRepo) -> None:
    started = big.soon("log", "no-such-ref")
    with pytest.raises(SourceError, match="no-such-ref"):
        started.stdout()
    assert started._proc is None and started._out is None  # reaped, files closed


def test_without_a_temporary_file_the_command_runs_when_read(
    big: GitRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pipeline.gitw.tempfile.TemporaryFile", full)
    started = big.soon("rev-parse", "HEAD")
    assert started._proc is None  # nothing began, nothing is left open
    monkeypatch.undo()
    assert started.stdout() == big.git("rev-parse", "HEAD")


def test_cancel_kills_a_running_git_and_reaps_it(big: GitRepo) -> None:
    started = big.soon("-c", "alias.slow=!sleep 1", "slow")
    proc = started._proc
    assert proc is not None and proc.poll() is None
    started.cancel()
    assert proc.returncode is not None  # reaped: no zombie, no running git


def test_a_check_reads_its_early_logs_and_leaves_none_behind(fx: CompatRepos) -> None:
    atom, aiter = GitRepo(fx.atom), GitRepo(fx.aiter)
    caches = checker.Caches.open(None)
    chk = checker.Checker(atom, fx.t["T1"], aiter, caches, tip=fx.a["A4"])
    started = dict(caches.soon)
    # aiter's whole-history log, ATOM's file creations, aiter's tree at the ATOM-date screen
    assert len(started) == 3 and f"tree:{chk.date_baseline}" in started
    report = chk.check(fx.a["A4"])
    assert not report.ok
    assert all(s._proc is None for s in started.values())  # all read by the check itself
    caches.close()
    assert caches.soon == {}

    unread = checker.Caches.open(None)
    checker.Checker(atom, fx.t["T1"], aiter, unread, tip=fx.a["A4"])  # a run that fails before reading
    procs = [s._proc for s in unread.soon.values()]
    unread.close()
    assert unread.soon == {} and all(p is None or p.returncode is not None for p in procs)


def test_many_blobs_are_read_in_one_batch_with_the_same_bytes(fx: CompatRepos) -> None:
    aiter = GitRepo(fx.aiter)
    shas = sorted(set(aiter.blob_shas(fx.a["A4"], prefix="aiter", suffix=".py").values()))
    assert len(shas) >= 2
    many = (shas * STREAM_MIN_BLOBS)[:STREAM_MIN_BLOBS]  # the batch path, repeats and all
    got = list(aiter.read_blobs(many))
    assert [s for s, _ in got] == many
    assert dict(got) == {s: aiter.cat_blobs([s])[s] for s in shas}
    with pytest.raises(SourceError, match="missing"):
        list(aiter.read_blobs([*many[:-1], "0" * 40]))
