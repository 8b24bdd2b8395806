"""The git tier's environment (tests/conftest.py): real git, a fixed identity, no user config."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_real_git_with_the_fixed_identity(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("git") is not None
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "f.txt").write_text("one\n")
    git(repo, "add", "f.txt")
    git(repo, "commit", "-q", "-m", "first")
    assert git(repo, "log", "-1", "--format=%an <%ae>|%cn|%s") == (
        "Pipeline Test <pipeline-test@example.invalid>|Pipeline Test|first"
    )
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"


def test_user_git_config_does_not_leak(tmp_path: Path) -> None:
    global_config = Path(os.environ["GIT_CONFIG_GLOBAL"])
    assert global_config.is_relative_to(tmp_path)
    assert os.environ["GIT_CONFIG_NOSYSTEM"] == "1"
    assert git(tmp_path, "config", "--global", "protocol.file.allow") == "always"
    origins = git(tmp_path, "config", "--list", "--show-origin")
    assert str(Path.home() / ".gitconfig") not in origins


def test_local_submodules_are_allowed(tmp_path: Path) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    git(sub, "init", "-q")
    git(sub, "commit", "-q", "--allow-empty", "-m", "sub")
    top = tmp_path / "top"
    top.mkdir()
    git(top, "init", "-q")
    git(top, "submodule", "add", "-q", str(sub), "deps/sub")
    git(top, "commit", "-q", "-m", "add sub")
    assert git(top, "submodule", "status").split()[1] == "deps/sub"
