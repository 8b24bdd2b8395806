"""GitRepo reads commits and blobs through its own `cat-file --batch`, as gitpython read them,
without importing gitpython (60 ms of every check's start-up)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import SourceError
from pipeline.gitw import GitRepo
from tests.fixtures.gitfixture import commit_all, git, init_repo, write_files


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, list[str]]:
    r = init_repo(tmp_path / "r")
    write_files(r, {"a.py": "x = 1\n"})
    shas = [commit_all(r, "first: plain\n\nbody line", "2026-01-01T00:00:00+00:00")]
    write_files(r, {"a.py": "x = 2\n", "d/b.py": "y = 1\n"})
    env = {"GIT_AUTHOR_NAME": "Zoë <Q> Bar", "GIT_AUTHOR_EMAIL": "z@example.com"}
    git(r, "add", "-A")
    git(r, "-c", "i18n.commitEncoding=ISO-8859-1", "commit", "-q", "-m", "caf\xe9 latin", env=env,
        date="2026-01-02T03:04:05+02:00")  # fmt: skip
    shas.append(git(r, "rev-parse", "HEAD"))
    git(r, "tag", "-a", "v1", "-m", "annotated")
    return r, shas


def test_commits_read_as_gitpython_reads_them(repo: tuple[Path, list[str]]) -> None:
    path, shas = repo
    ours = GitRepo(path)
    theirs = ours.repo  # gitpython, imported on first use
    for sha in shas:
        mine, c = ours.commit_info(sha), theirs.commit(sha)
        assert (mine.sha, mine.date.timestamp(), mine.subject, mine.author) == (
            c.hexsha, c.committed_date, c.summary, c.author.name,
        )  # fmt: skip
    assert ours.rev_parse("v1") == ours.rev_parse("HEAD") == shas[1]  # an annotated tag is peeled
    assert ours.rev_parse("HEAD~1") == shas[0]
    assert ours.rev_parse("no-such-ref") is None
    with pytest.raises(SourceError, match="not a commit"):
        ours.commit_info("no-such-ref")


def test_blobs_by_path_and_by_sha(repo: tuple[Path, list[str]]) -> None:
    path, shas = repo
    r = GitRepo(path)
    assert r.read_blob(shas[1], "d/b.py") == b"y = 1\n"
    assert r.read_blob(shas[0], "d/b.py") is None
    with pytest.raises(SourceError, match="not a commit"):
        r.read_blob("no-such-ref", "a.py")
    sha = r.blob_shas(shas[1])["a.py"]
    assert r.blob_sha(shas[1], "a.py") == sha and r.blob_sha(shas[1], "d") is None  # (a tree)
    assert dict(r.read_blobs([sha])) == {sha: b"x = 2\n"}
    with pytest.raises(SourceError, match="missing"):
        list(r.read_blobs(["0" * 40]))


def test_a_directory_that_is_no_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not a git repository"):
        GitRepo(tmp_path)
    with pytest.raises(SourceError, match="not a git repository"):
        GitRepo(tmp_path / "absent")


def test_a_check_never_imports_gitpython(tmp_path: Path) -> None:
    from tests.fixtures.compat_repos import build_compat_repos

    fx = build_compat_repos(tmp_path / "fx")
    code = (
        "import sys\n"
        "from pipeline.compat import run_check\n"
        "from pipeline.gitw import GitRepo\n"
        f"run_check(GitRepo({str(fx.atom)!r}), {fx.t['T2']!r}, GitRepo({str(fx.aiter)!r}), {fx.a['A4']!r})\n"
        "print('git' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
