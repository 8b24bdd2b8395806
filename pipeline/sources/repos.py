"""A repository named by a user: a local path read as it is, else the mirror of its URL (no fetch).

`check`, `recipe import` and `recipe drift` read repositories this way; a check of two local
repositories loads none of the fetch machinery (`pipeline.sources.mirrors`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import validate
from pipeline.errors import SourceError
from pipeline.sources.urls import is_local

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.gitw import GitRepo


def repo_path(settings: Settings, url: str, name: str) -> Path:
    """A local repository as it is (work tree or bare, patched branches included), else its mirror."""
    path = local_path(url, name)
    if path is not None:
        return path
    from pipeline.sources.mirrors import open_mirror  # (a URL: its mirror; local paths need none of that)

    return Path(open_mirror(settings, url, fetch=False).path)


def local_path(url: str, name: str) -> Path | None:
    """The local repository `url` names, as it is; None for a URL (read through its mirror)."""
    validate.url(url, what=f"{name} repository")
    path = Path(url).expanduser()
    if is_local(url) and path.exists():
        return path
    if is_local(url):
        raise SourceError(
            f"the {name} repository path {url} does not exist.",
            hint=f"Check --{name.lower()}-repo, pipeline.toml or PIPELINE_{name.upper()}_REPO.",
        )
    return None


def open_repo(settings: Settings, url: str, name: str) -> GitRepo:
    """A local repository as it is, else the mirror of the URL (no fetch)."""
    from pipeline.gitw import GitRepo

    return GitRepo(repo_path(settings, url, name))
