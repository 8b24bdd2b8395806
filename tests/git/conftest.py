"""Fixtures shared by the git tier's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.build_repos import BuildRepos
from tests.fixtures.project import build_world


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BuildRepos:
    """A project on the build fixture upstreams in tmp_path, as the current directory (`build_world`)."""
    return build_world(tmp_path, monkeypatch)
