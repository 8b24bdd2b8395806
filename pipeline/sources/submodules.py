"""aiter's submodules: read from `.gitmodules` and the gitlinks at a commit; mirrored best effort."""

from __future__ import annotations

import re

from pipeline.config import Settings
from pipeline.errors import InfraError, SourceError, sentence
from pipeline.fsutil import shorten
from pipeline.gitw import GitRepo
from pipeline.lock import Submodule
from pipeline.log import Logger
from pipeline.sources.mirrors import _open_existing, fetch_commit, keep_pinned, open_mirror
from pipeline.sources.urls import mirror_path, resolve_relative_url
from pipeline.validate import submodule_url_problem


def read_submodules(repo: GitRepo, rev: str, *, parent_url: str) -> tuple[Submodule, ...]:
    """Submodules at `rev`: `.gitmodules` (path -> url) joined with the gitlinks (path -> sha)."""
    links = repo.submodules(rev)
    if not links:
        return ()
    urls: dict[str, str] = {}
    if repo.read_blob(rev, ".gitmodules") is not None:
        out = repo.git("config", "--blob", f"{rev}:.gitmodules", "--null", "--list")
        names: dict[str, dict[str, str]] = {}
        for entry in out.split("\0"):
            if not entry:
                continue
            key, _, value = entry.partition("\n")
            m = re.match(r"^submodule\.(.+)\.(path|url)$", key)
            if m:
                names.setdefault(m.group(1), {})[m.group(2)] = value
        for fields in names.values():
            if "path" in fields and "url" in fields:
                urls[fields["path"]] = fields["url"]
    subs = []
    for path, sha in links:
        raw = urls.get(path, "")
        url = resolve_relative_url(parent_url, raw) if raw else ""
        problem = submodule_url_problem(raw, url, parent=parent_url) if raw else None
        if problem is not None:  # refused before anything is cloned or written to the lock
            raise SourceError(
                f"aiter {rev[:10]}'s .gitmodules gives submodule {shorten(path)} the URL {shorten(raw)}: "
                f"{problem}; refused, nothing was mirrored or pinned.",
                hint="Pin another aiter commit (--aiter-ref), or report the .gitmodules upstream.",
            )
        subs.append(Submodule(path=path, url=url, sha=sha))
    return tuple(subs)


def submodule_mirror(settings: Settings, url: str) -> GitRepo | None:
    """The existing mirror of a submodule URL, or None (no network)."""
    if not url:
        return None
    return _open_existing(mirror_path(settings, url))


def mirror_lock_submodules(
    settings: Settings, subs: tuple[Submodule, ...], log: Logger, *, offline: bool
) -> None:
    """Mirror the submodules a lock pins where none is yet (a build host given the plan's lock),
    as pinning does: local URLs always, others unless offline; failures are warnings."""
    from pipeline.sources.urls import is_local

    if not settings.sources.mirror_submodules:
        return
    for sub in subs:
        if submodule_mirror(settings, sub.url) is not None:
            continue
        if not offline or (sub.url and is_local(sub.url)):
            _mirror_submodule(settings, sub, log)


def _mirror_submodule(settings: Settings, sub: Submodule, log: Logger) -> None:
    if not sub.url:
        log.warn(f"submodule {sub.path} has no URL in .gitmodules; not mirrored.")
        return
    try:
        repo = open_mirror(
            settings, sub.url, log=log, retries=min(1, settings.sources.fetch_retries), progress=log.detail
        )
    except (SourceError, InfraError) as e:
        log.warn(
            f"submodule {sub.path} ({sub.url}) could not be mirrored: {sentence(e.message)} "
            "Its pinned SHA is in the lock; the render stage decides how to get it."
        )
        return
    if not repo.rev_parse(sub.sha) and not fetch_commit(repo, sub.sha, url=sub.url, log=log):
        log.warn(f"submodule {sub.path}: pinned commit {sub.sha} is not in the mirror of {sub.url}.")
        return
    keep_pinned(repo, sub.sha)
