"""`pipeline render`: write the Dockerfile and build context for a model from its lock."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipeline import validate
from pipeline.app import App, complete_model, pass_app
from pipeline.errors import PatchError, UsageError

if TYPE_CHECKING:
    from pipeline.lock import Lock
    from pipeline.stages.base import Context


def _submodule_repos(given: tuple[str, ...]) -> tuple[tuple[str, Path], ...]:
    """PATH=REPO flags (the mirrors of the submodule URLs serve the rest)."""
    out = []
    for item in given:
        path, sep, repo = item.partition("=")
        if not sep or not path or not repo:
            raise UsageError(f"--submodule-repo {validate.shown(item)}: expected SUBMODULE_PATH=REPOSITORY.")
        out.append((path, Path(repo)))
    return tuple(out)


@click.command(name="render")
@click.option(
    "--model",
    required=True,
    help="Model whose lock to render, e.g. MiniMax-M3-MXFP4.",
    shell_complete=complete_model,
)
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Lock file (default: <locks_dir>/<model>.toml).",
)
@click.option(
    "-o",
    "--output",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write the build context into (replaced if it holds an earlier render).",
)
@click.option(
    "--submodules",
    type=click.Choice(["mirror", "in-build"]),
    help="Where aiter's submodules come from: our mirrors (default) or fetched in the build "
    "at their pinned SHA (setting [image] submodules).",
)
@click.option(
    "--atom-repo",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="ATOM repository holding the locked commit (default: the pipeline's mirror).",
)
@click.option(
    "--aiter-repo",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="aiter repository holding the locked commit (default: the pipeline's mirror).",
)
@click.option(
    "--atom-tree",
    help="The patched ATOM commit; default: the series (--patches-dir) applied to the locked "
    "commit, which must apply exactly the patches the lock records.",
)
@click.option(
    "--submodule-repo",
    "submodule_repos",
    multiple=True,
    metavar="PATH=REPO",
    help="Mirror for an aiter submodule, e.g. 3rdparty/composable_kernel=/mirrors/ck.git.",
)
@click.option(
    "--recipe",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Recipe file (default: <recipes_dir>/<model>.yaml).",
)
@click.option(
    "--patches-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Patch series directory (default: [paths] patches_dir).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@pass_app
def command(
    app: App,
    model: str,
    lock_path: Path | None,
    out_dir: Path,
    submodules: str | None,
    atom_repo: Path | None,
    aiter_repo: Path | None,
    atom_tree: str | None,
    submodule_repos: tuple[str, ...],
    recipe: Path | None,
    patches_dir: Path | None,
    as_json: bool,
) -> None:
    """Render the Dockerfile and build context from the templates.

    \b
    The context holds the patched ATOM tree, the aiter tree with its
    submodules, the lock file and a .dockerignore; sources are copied from the
    pipeline's mirrors, nothing is cloned inside the build. Same lock, patches,
    recipe and template: byte-identical Dockerfile.
    """
    from pipeline.lock import Lock
    from pipeline.recipes.recipe import find_recipe
    from pipeline.stages import render

    validate.model(model)
    settings = app.settings(submodules=submodules)
    lock = Lock.load(lock_path or Path(settings.paths.locks_dir) / f"{model}.toml")  # verified by render.run
    if lock.model != model:
        raise UsageError(f"the lock is for model {lock.model!r}, not {model!r}.")
    recipe = recipe or find_recipe(model, Path(settings.paths.recipes_dir))
    ctx = app.context(work_dir=out_dir.parent)
    path = lock_path or Path(settings.paths.locks_dir) / f"{model}.toml"
    with app.log.stage("render", model) as rec:
        tree = lock.atom.sha
        if atom_tree is not None:
            tree = _commit(ctx, lock, atom_tree, atom_repo, aiter_repo)
        elif lock.applied_patches:  # the series applied to the locked commit (render verifies it)
            tree = _patched_tree(ctx, lock, patches_dir, atom_repo, aiter_repo)
        inputs = render.Inputs(
            lock=lock,
            atom_tree=tree,
            recipe=recipe,
            out_dir=out_dir,
            templates_dir=Path(settings.paths.templates_dir),
            image=settings.image,
            source_date_epoch=render.source_date_epoch(app.env),
            atom_repo=atom_repo,
            aiter_repo=aiter_repo,
            submodule_repos=_submodule_repos(submodule_repos),
            lock_path=path,
            lock_given=lock_path is not None,
            patches_dir=patches_dir,
        )
        out = render.run(ctx, inputs)
        rec.figure = out.figure()
        app.log.detail(f"Dockerfile: {out.dockerfile}")
    if as_json:
        app.emit_json(
            {
                "context": str(out.context),
                "dockerfile": str(out.dockerfile),
                "inputs_digest": out.inputs_digest,
                "image_ref": out.image_ref,
                "labels": out.labels,
            }
        )
    else:
        app.echo(f"{out.context}  inputs {out.inputs_digest[:12]}  → {out.image_ref}")


def _commit(ctx: Context, lock: Lock, rev: str, atom_repo: Path | None, aiter_repo: Path | None) -> str:
    from pipeline.stages import patch

    atom, _ = patch.repos(ctx, lock, atom_repo, aiter_repo)
    sha: str | None = atom.rev_parse(rev)
    if sha is None:
        raise UsageError(f"--atom-tree {validate.shown(rev)} is not a commit in {atom.path}.")
    return sha


def _patched_tree(
    ctx: Context, lock: Lock, patches_dir: Path | None, atom_repo: Path | None, aiter_repo: Path | None
) -> str:
    """The series applied to the locked commit; `render.run` verifies the lock records exactly it."""
    from pipeline.patchq import PatchSeries, patched_commit
    from pipeline.stages import patch

    atom, aiter = patch.repos(ctx, lock, atom_repo, aiter_repo)
    try:
        series = PatchSeries.load(patches_dir or Path(ctx.settings.paths.patches_dir))
        return patched_commit(series, atom, lock.atom.sha, aiter, lock.aiter.sha).head_sha
    except PatchError:
        return lock.atom.sha  # the verification names what does not match
