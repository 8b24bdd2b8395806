"""Fixtures shared by the git tier's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import retry
from tests.fixtures.build_repos import BuildRepos
from tests.fixtures.project import build_world
from tests.fixtures.upstream_repos import Upstreams, make_upstreams


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BuildRepos:
    """A project on the build fixture upstreams in tmp_path, as the current directory (`build_world`)."""
    return build_world(tmp_path, monkeypatch)


@pytest.fixture
def ups(tmp_path: Path) -> Upstreams:
    """The fixture upstreams in tmp_path: ATOM, and aiter with its composable_kernel submodule."""
    return make_upstreams(tmp_path)


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries without the real back-off (what is retried is the same, only sooner)."""
    monkeypatch.setattr(retry, "BACKOFF_SECONDS", 0.01)
