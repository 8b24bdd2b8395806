"""GitRepo on a repository with a work tree: commands run in that work tree, not the caller's cwd."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.gitw import GitRepo


def _init(path: Path) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_add_all_stages_the_work_trees_files_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo_dir = _init(tmp_path / "repo")
    (repo_dir / "pkg").mkdir()
    (repo_dir / "pkg" / "mod.py").write_text("x = 1\n")
    elsewhere = tmp_path / "elsewhere"  # the caller's cwd holds files of its own
    elsewhere.mkdir()
    (elsewhere / "stray.txt").write_text("not the repository's\n")
    monkeypatch.chdir(elsewhere)

    repo = GitRepo(repo_dir)
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "tree")

    assert repo.git("ls-tree", "-r", "--name-only", "HEAD").splitlines() == ["pkg/mod.py"]
    assert repo.git("status", "--porcelain") == ""


def test_a_bare_mirror_is_still_addressed_by_its_git_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = _init(tmp_path / "work")
    (work / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(work), "add", "a.txt"], check=True)
    subprocess.run(["git", "-C", str(work), "commit", "-q", "-m", "a"], check=True)
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(work), str(bare)], check=True)
    (bare / "config").unlink()  # mirrors may lack one; discovery alone would miss the repository
    monkeypatch.chdir(work)  # a different repository as the current directory

    repo = GitRepo(bare)
    assert repo.work_tree is None
    assert (
        repo.git("rev-parse", "HEAD")
        == subprocess.run(
            ["git", "-C", str(work), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )


def test_selfcheck_commits_the_copied_tree_without_a_workaround(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.image.selfcheck import _commit_tree

    src = tmp_path / "src"
    (src / "atom").mkdir(parents=True)
    (src / "atom" / "m.py").write_text("import aiter\n")
    monkeypatch.chdir(tmp_path)  # not the copy: GitRepo must commit the copy's own files
    repo, sha = _commit_tree(src, tmp_path / "copy")
    assert repo.git("ls-tree", "-r", "--name-only", sha).splitlines() == ["atom/m.py"]
