"""patch: apply the ATOM patch series to the pinned commit; record it in the lock, which is then final.

The patched commit is made in the mirror's object store (no work tree, no branch)
and kept by a ref so no gc drops it; with `workdir` (`pipeline patch apply`) the
same commits are also checked out on a `pipeline/patched/*` branch to look at.
After this stage the lock does not change: check, render, build, smoke and tag
read exactly this lock and this commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.lock import Lock, PatchPin
from pipeline.stages import pin as pin_stage
from pipeline.stages.base import Context, StageData, Upstream
from pipeline.stages.spec import BuildSpec

if TYPE_CHECKING:
    from pipeline.gitw import GitRepo

NAME = "patch"
STOPS: tuple[type[Exception], ...] = ()


class Inputs(StageData):
    lock: Lock  # the pin's lock (any patches it records are replaced)
    patches_dir: Path
    out: Path | None  # the lock file to write the final lock to (None: do not write)
    atom_repo: Path | None = None  # default: the mirror of the locked source
    aiter_repo: Path | None = None
    workdir: Path | None = None  # also check the result out on a branch here


class Outputs(StageData):
    head: str  # the patched ATOM commit (the locked one when nothing applies)
    lock: Lock  # the final lock: the pin plus every patch's status and sha256
    notes: tuple[str, ...] = ()
    branch: str | None = None
    worktree: Path | None = None

    @property
    def applied(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.lock.applied_patches)

    def figure(self) -> str:
        names = self.applied
        return f"{len(names)} applied" + (f": {', '.join(names)}" if names else "")


def plan(ctx: Context, spec: BuildSpec, up: Upstream) -> Inputs:
    pinned = up.get("pin", pin_stage.Outputs)
    return Inputs(
        lock=pinned.lock,
        patches_dir=Path(ctx.settings.paths.patches_dir),
        out=ctx.work_dir / "lock.toml",
    )


def reads(ctx: Context, inputs: Inputs) -> Iterable[Path]:
    return [inputs.patches_dir]


def repos(
    ctx: Context, lock: Lock, atom_repo: Path | None, aiter_repo: Path | None
) -> tuple[GitRepo, GitRepo]:
    """The repositories holding the locked commits: the ones given, else the pipeline's mirrors."""
    from pipeline.gitw import GitRepo

    if atom_repo is not None and aiter_repo is not None:
        return GitRepo(atom_repo), GitRepo(aiter_repo)
    from pipeline.sources import mirrors_for_lock, open_mirror

    if atom_repo is None and aiter_repo is None:
        return mirrors_for_lock(ctx.settings, lock)
    atom = GitRepo(atom_repo) if atom_repo else open_mirror(ctx.settings, lock.atom.url, fetch=False)
    aiter = GitRepo(aiter_repo) if aiter_repo else open_mirror(ctx.settings, lock.aiter.url, fetch=False)
    return atom, aiter


def run(ctx: Context, inputs: Inputs) -> Outputs:
    from pipeline.patchq import PatchSeries, apply_series, patched_commit
    from pipeline.sources import keep_pinned

    lock = inputs.lock
    atom, aiter = repos(ctx, lock, inputs.atom_repo, inputs.aiter_repo)
    series = PatchSeries.load(inputs.patches_dir)
    if inputs.workdir is not None:
        applied = apply_series(series, atom, lock.atom.sha, aiter, lock.aiter.sha, workdir=inputs.workdir)
    else:
        applied = patched_commit(series, atom, lock.atom.sha, aiter, lock.aiter.sha)
    if applied.head_sha != lock.atom.sha:
        keep_pinned(atom, applied.head_sha)  # a ref, so no gc drops it before render
    for note in applied.notes:
        ctx.log.info(f"  {note}")
    final = lock.with_patches(tuple(PatchPin.model_validate(p.model_dump()) for p in applied.pins))
    if inputs.out is not None and final.save(inputs.out):
        ctx.log.detail(f"recorded {len(final.patches)} patch(es) in {inputs.out}")
    return Outputs(
        head=applied.head_sha,
        lock=final,
        notes=tuple(applied.notes),
        branch=applied.branch,
        worktree=applied.worktree,
    )
