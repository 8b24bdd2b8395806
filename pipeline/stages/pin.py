"""pin: resolve ATOM and aiter refs to full SHAs (and aiter's submodules, the base image digest).

Writes the lock file every later stage reads (without patches: the patch stage
adds them and freezes it). `--auto` is composed here: the pin resolves the refs
(pipeline.sources), and the compat search (pipeline.compat, with the patch
series from pipeline.patchq) chooses the newest aiter compatible with ATOM.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.lock import Lock
from pipeline.stages.base import Context, StageData, Upstream
from pipeline.stages.spec import BuildSpec

if TYPE_CHECKING:
    from pipeline.compat import CheckReport
    from pipeline.gitw import CommitInfo, GitRepo
    from pipeline.log import Logger
    from pipeline.sources import AiterChooser

NAME = "pin"
STOPS: tuple[type[Exception], ...] = ()


class Commit(StageData):
    sha: str
    date: str
    subject: str


class AutoReport(StageData):
    """What `--auto`'s search found."""

    requested: Commit  # the aiter commit the ref resolved to
    commits_examined: int
    first_breaking: Commit | None
    newest_compatible: Commit | None


class Inputs(StageData):
    model: str
    atom_repo: str
    aiter_repo: str
    atom_ref: str
    aiter_ref: str
    base_image: str | None  # None: the configured one, keeping a digest the previous lock pinned for it
    out: Path  # the lock file to write
    given_lock: Path | None = None  # use this lock as it is (its commits must be in the mirrors)
    previous: Path | None = None  # the lock last written for the model (patches and digest kept)
    offline: bool = False
    auto: bool = False
    recipe: Path | None = None  # --auto: the recipe's waivers apply to the search
    patches_dir: Path | None = None  # --auto: the search runs on ATOM plus the series
    base_digest_required: bool = True  # no digest (no registry answered): exit 11, not a lock render refuses


class Outputs(StageData):
    lock: Lock
    lock_path: Path
    changed: bool
    auto: AutoReport | None = None

    def figure(self) -> str:
        return f"ATOM {self.lock.atom.sha[:9]} · aiter {self.lock.aiter.sha[:10]}" + (
            "" if self.changed else " (unchanged)"
        )


def plan(ctx: Context, spec: BuildSpec, up: Upstream) -> Inputs:
    paths = ctx.settings.paths
    # locks/<model>.toml as it was when the run started (the tag stage rewrites that file)
    released = ctx.work_dir / spec.previous_lock if spec.previous_lock else None
    return Inputs(
        model=spec.model,
        atom_repo=spec.atom_repo,
        aiter_repo=spec.aiter_repo,
        atom_ref=spec.atom_ref,
        aiter_ref=spec.aiter_ref,
        base_image=spec.base_image,
        out=ctx.work_dir / "lock.toml",
        given_lock=spec.lock_path,
        previous=released if released is not None and released.is_file() else None,
        offline=spec.offline,
        auto=spec.auto_aiter,
        recipe=spec.recipe_path,
        patches_dir=Path(paths.patches_dir),
    )


def reads(ctx: Context, inputs: Inputs) -> Iterable[Path]:
    out = [p for p in (inputs.given_lock, inputs.previous) if p is not None]
    if inputs.auto:
        out += [p for p in (inputs.recipe, inputs.patches_dir) if p is not None]
    return out


def _commit(c: CommitInfo) -> Commit:
    return Commit(sha=c.sha, date=c.iso_date, subject=c.subject)


def keep_given_digest(lock: Lock, previous: Lock | None, log: Logger) -> Lock:
    """No registry answered for the base image: keep the digest the previous lock has for that name.

    The digest may have been given by hand (`pin --base-image NAME@sha256:…`), so the previous
    reference carries it and differs from the configured NAME; the name is what must match.
    """
    if lock.base_image.digest or previous is None or not previous.base_image.digest:
        return lock
    if previous.base_image.ref.split("@", 1)[0] != lock.base_image.ref.split("@", 1)[0]:
        return lock
    log.warn(f"keeping the base image digest of the existing lock ({previous.base_image.digest}).")
    return lock.model_copy(update={"base_image": previous.base_image})


def run(ctx: Context, inputs: Inputs) -> Outputs:
    from pipeline import sources
    from pipeline.validate import check_tag_templates

    check_tag_templates(ctx.settings)  # a bad tag template fails now, not after build and smoke
    if inputs.given_lock is not None:
        lock = Lock.load(inputs.given_lock)
        sources.mirrors_for_lock(ctx.settings, lock, fetch=not inputs.offline)  # its commits must be there
        # a host that never pinned (a build job given the plan's lock) mirrors the submodules too
        sources.mirror_lock_submodules(ctx.settings, lock.aiter.submodules, ctx.log, offline=inputs.offline)
        from pipeline.stages.verify import verify_lock

        verify_lock(ctx, lock, lock_path=inputs.given_lock, lock_given=True, patches_dir=inputs.patches_dir)
        ctx.log.detail(f"using the given lock file {inputs.given_lock}")
        return Outputs(lock=lock, lock_path=inputs.out, changed=lock.save(inputs.out))

    previous = Lock.load(inputs.previous) if inputs.previous is not None else None
    settings = ctx.settings.model_copy(
        update={
            "sources": ctx.settings.sources.model_copy(
                update={"atom_repo": inputs.atom_repo, "aiter_repo": inputs.aiter_repo}
            )
        }
    )
    found: dict[str, Any] = {}
    chooser = _auto_chooser(ctx, inputs, found) if inputs.auto else None
    result = sources.pin(
        settings,
        model=inputs.model,
        atom_ref=inputs.atom_ref,
        aiter_ref=inputs.aiter_ref,
        base_image=inputs.base_image or ctx.settings.image.base_image,
        log=ctx.log,
        offline=inputs.offline,
        previous=previous,
        choose_aiter=chooser,
        env=ctx.env,
        require_base_digest=inputs.base_digest_required,
    )
    auto = None
    if inputs.auto:
        auto = AutoReport(
            requested=_commit(result.aiter_requested),
            commits_examined=int(found.get("commits_examined", 0)),
            first_breaking=found.get("first_breaking"),
            newest_compatible=found.get("newest_compatible"),
        )
    lock = keep_given_digest(result.lock, previous, ctx.log)
    return Outputs(lock=lock, lock_path=inputs.out, changed=lock.save(inputs.out), auto=auto)


def _auto_chooser(ctx: Context, inputs: Inputs, found: dict[str, Any]) -> AiterChooser:
    """`--auto`: the newest aiter ATOM's calls bind (the series applied, gated as the check stage gates)."""
    from pipeline.errors import IncompatibleError, sentence
    from pipeline.patchq import PatchSeries

    compat = importlib.import_module("pipeline.compat")  # from sys.modules: the git tier stands in for it
    patches = inputs.patches_dir
    series = PatchSeries.load(patches) if patches is not None and patches.is_dir() else None
    cache = ctx.settings.cache_dir / "compat"
    recipe = None
    if inputs.recipe is not None and inputs.recipe.is_file():
        from pipeline.recipes.recipe import load_recipe

        recipe = load_recipe(inputs.recipe)

    def choose(atom_repo: GitRepo, atom: CommitInfo, aiter_repo: GitRepo, head: CommitInfo) -> CommitInfo:
        ctx.log.info(
            f"searching aiter up to {head.short} for the newest commit compatible with ATOM {atom.short}"
        )
        adjust = None
        if recipe is not None:
            # The check stage's gate: the model's code path (an off-path break does not make an aiter
            # incompatible for this model), then the recipe's reviewed waivers.
            from pipeline.compat.reach import gate_model

            def adjust(report: CheckReport) -> CheckReport:
                return gate_model(report, atom_repo, recipe, cache_dir=cache).report

        res = compat.search_compatible(
            atom_repo,
            atom.sha,
            aiter_repo,
            head.sha,
            cache_dir=cache,
            patches=series,
            adjust=adjust,
        )
        first: CommitInfo | None = res.first_breaking
        newest: CommitInfo | None = res.newest_compatible
        found["commits_examined"] = res.commits_examined
        found["first_breaking"] = _commit(first) if first else None
        found["newest_compatible"] = _commit(newest) if newest else None
        if first is not None:
            ctx.log.info(f"first breaking aiter commit: {first.short} {first.subject}")
        if newest is None:
            breaking = f" The first breaking aiter commit: {first.sha} {first.subject!r}." if first else ""
            said = res.explanation
            if not said.startswith("no aiter commit"):  # the search's reason, after our sentence
                said = (
                    f"no aiter commit up to {head.sha} is compatible with ATOM {atom.sha}"
                    + (" even with the patch series" if series is not None else " without patches")
                    + f". {said}"
                )
            raise IncompatibleError(
                sentence(said) + breaking,
                hint="Pin aiter explicitly (--aiter REF) and let the patch stage adapt ATOM, "
                "or choose another ATOM commit.",
            )
        return newest

    return choose
