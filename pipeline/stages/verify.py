"""One verification of a lock file against the mirrors and the patch series (issue 27 §2).

A lock is a claim about commits and files; every command that acts on one
(`check --lock`, `render`, `build`, `rebuild --plan`, and the pin stage of a run
given `--lock`) calls `verify_lock` first, so none of them trusts a field someone
could have edited. What is recomputed, never read from the lock:

- both locked commits exist (in the mirrors, or the repositories given);
- each source's date and subject are its commit's own; aiter's submodules are
  the gitlinks of its commit, ATOM records none;
- the base image reference parses, and a digest written into it is the pinned one;
- every recorded patch is in the series with the same sha256 (the file's bytes),
  and the series applied to the locked ATOM commit gives exactly the recorded
  statuses (a patch recorded `not-needed` that the tree needs is inconsistent);
  the patched commit is that series applied to that commit, nothing else.

A lock that records no patches is a pin (`pipeline pin` before `pipeline patch apply`):
`check` reads it as the pristine pin; `final=True` (render, build) requires the
series to apply nothing to it. Lives in `stages/` because it composes `sources`
and `patchq`, which know nothing of each other.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import LockInconsistent, PatchError
from pipeline.lock import Lock, PatchPin

if TYPE_CHECKING:
    from pipeline.gitw import GitRepo
    from pipeline.stages.base import Context


@dataclass(frozen=True)
class Mismatch:
    """One field of the lock that is not what the mirrors or the series say."""

    field: str  # e.g. `sources.atom.date`, `patches[0] (0001-x.patch).status`
    recorded: str
    actual: str
    repair: str = "pin"  # which command repairs it: "pin" (sources) or "patch" (the series)


@dataclass(frozen=True)
class VerifiedLock:
    lock: Lock
    head: str  # the patched ATOM commit (the locked one when no patch applies)
    atom: GitRepo
    aiter: GitRepo


def verify_lock(
    ctx: Context,
    lock: Lock,
    *,
    lock_path: Path | None,
    lock_given: bool = False,
    patches_dir: Path | None = None,
    atom_repo: Path | None = None,
    aiter_repo: Path | None = None,
    final: bool = False,
) -> VerifiedLock:
    """Verify `lock` (read from `lock_path`) or raise `LockInconsistent` listing every mismatch.

    `lock_given`: the user named the file with `--lock`, so the repair commands say it too.
    `final`: the lock must be the patch stage's (render, build): a series that applies a patch
    the lock does not record is a mismatch even when the lock records none.
    """
    from pipeline.sources import keep_pinned

    where = str(lock_path) if lock_path is not None else "(the lock)"
    atom, aiter = _repos(ctx, lock, atom_repo, aiter_repo)
    found: list[Mismatch] = []
    missing = False
    for name, src, repo in (("atom", lock.atom, atom), ("aiter", lock.aiter, aiter)):
        if repo.rev_parse(f"{src.sha}^{{commit}}") is None:
            found.append(Mismatch(f"sources.{name}.sha", src.sha, f"no such commit in {repo.path}"))
            missing = True
            continue
        info = repo.commit_info(src.sha)
        if src.date != info.iso_date:
            found.append(Mismatch(f"sources.{name}.date", src.date, info.iso_date))
        if src.subject != info.subject:
            found.append(Mismatch(f"sources.{name}.subject", repr(src.subject), repr(info.subject)))
    if not missing:
        from pipeline.sources import read_submodules

        subs = read_submodules(aiter, lock.aiter.sha, parent_url=lock.aiter.url)
        for name, src, actual in (("atom", lock.atom, ()), ("aiter", lock.aiter, subs)):
            rec = {s.path: f"{s.sha} {s.url}" for s in src.submodules}
            act = {s.path: f"{s.sha} {s.url}" for s in actual}
            for path in sorted(rec.keys() | act.keys()):
                if rec.get(path) != act.get(path):
                    found.append(
                        Mismatch(
                            f"sources.{name}.submodules {path}",
                            rec.get(path, "(none)"),
                            act.get(path, "(not a submodule of the commit)"),
                        )
                    )
    found += _base_image(lock)
    head = lock.atom.sha
    directory = patches_dir or Path(ctx.settings.paths.patches_dir)
    if lock.patches or final:
        patch_found, head = _patches(ctx, lock, directory, atom, aiter, skip_apply=bool(found))
        found += patch_found
    if found:
        default = Path(ctx.settings.paths.patches_dir)
        raise _inconsistent(lock, where, lock_given, found, None if directory == default else directory)
    if head != lock.atom.sha:
        keep_pinned(atom, head)  # a ref, so no gc drops it before render
    return VerifiedLock(lock, head, atom, aiter)


def verify_here(ctx: Context, lock_path: Path, *, lock_given: bool, stage: str) -> bool:
    """`verify_lock` of `lock_path` where this host has the mirrors of both locked sources (smoke
    and tag may run on a GPU host that has none); else one line says what is and is not checked.
    True when it was verified against its commits and the series."""
    from pipeline.errors import SourceError

    lock = Lock.load(lock_path)
    try:
        _repos(ctx, lock, None, None)
    except SourceError:
        ctx.log.info(
            f"{stage}: no mirrors of ATOM and aiter on this host ({ctx.settings.cache_dir}): the lock "
            f"{lock_path} is not verified against its commits here (render and build did, where it was "
            "built); it is bound by its digest to the image's label and the verdict"
        )
        return False
    verify_lock(ctx, lock, lock_path=lock_path, lock_given=lock_given, final=True)
    return True


def bind_lock(lock_path: Path, image_labels: Mapping[str, str], image: str, *, done: str) -> None:
    """The lock file pins the pair the image was built from (`Lock.require_pair`)."""
    Lock.load(lock_path).require_pair(image_labels, image, name=f"lock file {lock_path}", done=done)


def _repos(
    ctx: Context, lock: Lock, atom_repo: Path | None, aiter_repo: Path | None
) -> tuple[GitRepo, GitRepo]:
    """The repositories given, else the mirrors of the locked URLs (no fetch; their absence is a
    source problem of this host, not of the lock)."""
    from pipeline.gitw import GitRepo
    from pipeline.sources import open_mirror

    atom = GitRepo(atom_repo) if atom_repo else open_mirror(ctx.settings, lock.atom.url, fetch=False)
    aiter = GitRepo(aiter_repo) if aiter_repo else open_mirror(ctx.settings, lock.aiter.url, fetch=False)
    return atom, aiter


def _base_image(lock: Lock) -> list[Mismatch]:
    from pipeline.errors import UsageError
    from pipeline.oci.ref import parse_image_ref

    ref = lock.base_image.ref
    try:
        parsed = parse_image_ref(ref)
    except UsageError as e:
        return [Mismatch("base_image.ref", repr(ref), f"not an image reference ({e.message})")]
    if parsed.digest and parsed.digest != lock.base_image.digest:
        return [
            Mismatch("base_image.digest", lock.base_image.digest or "(none)", f"{parsed.digest} (in ref)")
        ]
    return []


def _patches(
    ctx: Context, lock: Lock, directory: Path, atom: GitRepo, aiter: GitRepo, *, skip_apply: bool
) -> tuple[list[Mismatch], str]:
    """The recorded patches against the series' files, then against what applying it gives."""
    from pipeline.patchq import PatchSeries, patched_commit

    try:
        series = PatchSeries.load(directory)
    except PatchError as e:
        if not lock.patches:  # a pin and no series: nothing to apply, nothing recorded
            return [], lock.atom.sha
        return [
            Mismatch("patches", _names(lock.patches), f"no series to verify them ({e.message})", "patch")
        ], (lock.atom.sha)
    out: list[Mismatch] = []
    files = {p.name: p for p in series}
    for i, pin in enumerate(lock.patches):
        patch = files.get(pin.name)
        label = f"patches[{i}] ({pin.name})"
        if patch is None:
            out.append(
                Mismatch(label, f"sha256 {pin.sha256}", f"not in the series {directory / 'series'}", "patch")
            )
        elif patch.sha256 != pin.sha256:
            out.append(Mismatch(f"{label}.sha256", pin.sha256, f"{patch.sha256} ({patch.path})", "patch"))
    if out or skip_apply:
        return out, lock.atom.sha
    try:
        applied = patched_commit(series, atom, lock.atom.sha, aiter, lock.aiter.sha)
    except PatchError as e:
        return [
            Mismatch(
                "patches", _names(lock.applied_patches), f"the series does not apply: {e.message}", "patch"
            )
        ], (lock.atom.sha)
    recorded = {p.name: p for p in lock.patches}
    computed = {p.name: p for p in applied.pins}
    if not lock.patches:  # a pin: only "applies nothing" is consistent with it (final)
        if applied.pins and applied.head_sha != lock.atom.sha:
            names = ", ".join(p.name for p in applied.pins if p.status == "applied")
            out.append(
                Mismatch("patches", "(none: a pin, not patched)", f"the series applies {names}", "patch")
            )
        return out, applied.head_sha
    for i, pin in enumerate(lock.patches):
        got = computed.get(pin.name)
        if got is not None and got.status != pin.status:
            out.append(Mismatch(f"patches[{i}] ({pin.name}).status", pin.status, got.status, "patch"))
    for name in computed.keys() - recorded.keys():
        out.append(Mismatch(f"patches ({name})", "(not recorded)", computed[name].status, "patch"))
    if [p.name for p in lock.patches] != [p.name for p in applied.pins] and not out:
        out.append(Mismatch("patches (order)", _names(lock.patches), _names(applied.pins), "patch"))
    return out, applied.head_sha


def _names(pins: tuple[PatchPin, ...]) -> str:
    return ", ".join(p.name for p in pins) or "(none)"


def _inconsistent(
    lock: Lock, where: str, lock_given: bool, found: list[Mismatch], directory: Path | None
) -> LockInconsistent:
    width = max(len(m.field) for m in found)
    rows = [
        f"  {m.field:<{width}}  recorded {m.recorded}\n  {'':<{width}}  actual   {m.actual}" for m in found
    ]
    lock_flag = f" --lock {shlex.quote(where)}" if lock_given else ""
    steps = []
    if any(m.repair == "pin" for m in found):
        steps.append(
            f"pipeline pin --model {lock.model}{lock_flag} --atom-repo {shlex.quote(lock.atom.url)} "
            f"--aiter-repo {shlex.quote(lock.aiter.url)} --atom {lock.atom.sha} --aiter {lock.aiter.sha}"
        )
    if lock.patches or any(m.repair == "patch" for m in found):
        dir_flag = f" --patches-dir {shlex.quote(str(directory))}" if directory is not None else ""
        steps.append(f"pipeline patch apply --model {lock.model}{lock_flag}{dir_flag}")
    return LockInconsistent(
        f"lock file {where} is inconsistent with the mirrors and the patch series (edited by hand, or "
        f"written for other sources); nothing was done:\n" + "\n".join(rows),
        hint="To rewrite it from what the commits and the series say: "
        + " && ".join(f"`{s}`" for s in steps)
        + ". Or restore the lock from version control.",
    )


__all__ = ["Mismatch", "VerifiedLock", "bind_lock", "verify_here", "verify_lock"]
