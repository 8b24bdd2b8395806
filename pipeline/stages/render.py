"""render: the deterministic Dockerfile and build context, from the templates and the final lock.

The context holds the checked ATOM tree (the patch stage's commit), aiter and
its submodules from the mirrors, the lock and the render manifest. Same lock,
patches, recipe, templates and SOURCE_DATE_EPOCH: the same Dockerfile and the
same inputs digest, whether `pipeline render` or `pipeline build --model` ran it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import ImageSettings
from pipeline.errors import UsageError
from pipeline.lock import Lock
from pipeline.stages import patch as patch_stage
from pipeline.stages.base import Context, StageData, Upstream
from pipeline.stages.spec import BuildSpec

if TYPE_CHECKING:
    from pipeline.gitw import GitRepo

NAME = "render"
STOPS: tuple[type[Exception], ...] = ()


class Inputs(StageData):
    lock: Lock
    atom_tree: str  # the patched ATOM commit
    recipe: Path
    out_dir: Path
    templates_dir: Path
    image: ImageSettings  # base image, repository, build commands, where submodules come from
    source_date_epoch: int | None = None
    atom_repo: Path | None = None  # default: the mirrors of the locked sources
    aiter_repo: Path | None = None
    submodule_repos: tuple[tuple[str, Path], ...] = ()  # (submodule path, repository) before the mirrors
    lock_path: Path | None = None  # the file the lock was read from: it must still say `lock`
    lock_given: bool = False  # named with --lock (the repair command says so)
    patches_dir: Path | None = None  # the series the lock is verified against (default: [paths])


class Outputs(StageData):
    context: Path
    dockerfile: Path
    inputs_digest: str
    image_ref: str  # the candidate tag: <repository>:candidate-<digest12>
    labels: dict[str, str]

    def figure(self) -> str:
        return f"inputs {self.inputs_digest[:12]}"


def source_date_epoch(env: Mapping[str, str]) -> int | None:
    """SOURCE_DATE_EPOCH from the environment (reproducible-builds.org), None when unset."""
    raw = env.get("SOURCE_DATE_EPOCH")
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise UsageError(
            f"SOURCE_DATE_EPOCH={raw[:40]!r} is not an integer.",
            hint="Set it to seconds since 1970 (e.g. `git log -1 --format=%ct`), or unset it.",
        ) from None


def plan(ctx: Context, spec: BuildSpec, up: Upstream) -> Inputs:
    patched = up.get("patch", patch_stage.Outputs)
    return Inputs(
        lock=patched.lock,
        atom_tree=patched.head,
        recipe=spec.recipe_path,
        out_dir=ctx.work_dir / "context",
        templates_dir=Path(ctx.settings.paths.templates_dir),
        image=ctx.settings.image,
        source_date_epoch=source_date_epoch(ctx.env),
        lock_path=ctx.work_dir / "lock.toml",
        patches_dir=Path(ctx.settings.paths.patches_dir),
    )


def reads(ctx: Context, inputs: Inputs) -> Iterable[Path]:
    # the lock file too: edited after the patch stage, render runs again and refuses it
    return [inputs.templates_dir, inputs.recipe, *([inputs.lock_path] if inputs.lock_path else [])]


def _verified(ctx: Context, inputs: Inputs) -> tuple[GitRepo, GitRepo]:
    """The lock verified (`stages.verify`), the file it came from unchanged, and `atom_tree` the
    series applied to its commit: render acts only on what was checked."""
    from pipeline.errors import LockInconsistent
    from pipeline.lock import Lock
    from pipeline.stages.verify import verify_lock

    path = inputs.lock_path
    if path is not None:
        on_disk = Lock.load(path)
        if on_disk != inputs.lock:
            raise LockInconsistent(
                f"lock file {path} changed after the patch stage recorded it: it now pins "
                f"{on_disk.digest()[:12]}, the run recorded {inputs.lock.digest()[:12]}; "
                "nothing was rendered.",
                hint=f"Restore it (`git diff {path}` shows the edit), or start a new run.",
            )
    verified = verify_lock(
        ctx,
        inputs.lock,
        lock_path=path,
        lock_given=inputs.lock_given,
        patches_dir=inputs.patches_dir,
        atom_repo=inputs.atom_repo,
        aiter_repo=inputs.aiter_repo,
        final=True,
    )
    tree = verified.atom.rev_parse(f"{inputs.atom_tree}^{{commit}}")
    if tree != verified.head:
        raise LockInconsistent(
            f"the ATOM tree to render ({inputs.atom_tree[:12]}) is not the lock's series applied to ATOM "
            f"{inputs.lock.atom.short} ({verified.head[:12]}); nothing was rendered.",
            hint="Render without --atom-tree (the patched commit is derived from the lock), or record the "
            "series in the lock first (`pipeline patch apply`).",
        )
    return verified.atom, verified.aiter


def run(ctx: Context, inputs: Inputs) -> Outputs:
    from pipeline.gitw import GitRepo
    from pipeline.image.render import render_context
    from pipeline.sources import submodule_mirror

    settings = ctx.settings.model_copy(update={"image": inputs.image})
    atom, aiter = _verified(ctx, inputs)
    given = dict(inputs.submodule_repos)
    subs: dict[str, GitRepo | None] = {
        s.path: GitRepo(given[s.path]) if s.path in given else submodule_mirror(settings, s.url)
        for s in inputs.lock.aiter.submodules
    }
    ctx.log.detail(f"rendering into {inputs.out_dir}")
    rendered = render_context(
        lock=inputs.lock,
        atom=atom,
        atom_tree_sha=inputs.atom_tree,
        aiter=aiter,
        submodule_repos=subs,
        recipe_path=inputs.recipe,
        settings=settings,
        out_dir=inputs.out_dir,
        templates_dir=inputs.templates_dir,
        source_date_epoch=inputs.source_date_epoch,
    )
    ctx.log.info(f"{rendered.parity_summary} (see {rendered.dir / 'parity.md'})")
    for note in rendered.notes:
        ctx.log.warn(note)
    return Outputs(
        context=rendered.dir,
        dockerfile=rendered.dockerfile,
        inputs_digest=rendered.inputs_digest,
        image_ref=rendered.image_ref,
        labels=rendered.labels,
    )
