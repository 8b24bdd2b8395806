"""`pipeline render`: write the Dockerfile and build context for a model from its lock."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import click

from pipeline.app import App, pass_app
from pipeline.config import Settings
from pipeline.errors import PatchError, UsageError
from pipeline.gitw import GitRepo
from pipeline.lock import Lock, default_lock_path
from pipeline.patchq import PatchSeries, patched_commit
from pipeline.render import RenderedContext, render_context
from pipeline.sources import mirrors_for_lock, submodule_mirror, validate_model


def source_date_epoch(env: Mapping[str, str]) -> int | None:
    raw = env.get("SOURCE_DATE_EPOCH")
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"SOURCE_DATE_EPOCH={raw!r} is not an integer (seconds since 1970).") from None


def _mirrors(
    settings: Settings, lock: Lock, atom_repo: Path | None, aiter_repo: Path | None
) -> tuple[GitRepo, GitRepo]:
    """The repositories holding the locked commits: the flags, else the pipeline's mirrors."""
    if atom_repo is not None and aiter_repo is not None:
        return GitRepo(atom_repo), GitRepo(aiter_repo)
    atom, aiter = mirrors_for_lock(settings, lock)
    return GitRepo(atom_repo) if atom_repo else atom, GitRepo(aiter_repo) if aiter_repo else aiter


def _submodule_repos(settings: Settings, lock: Lock, given: tuple[str, ...]) -> dict[str, GitRepo | None]:
    """PATH=REPO flags first, else the mirror of each submodule URL (None when there is none)."""
    repos: dict[str, GitRepo | None] = {}
    for item in given:
        path, sep, repo = item.partition("=")
        if not sep or not path or not repo:
            raise UsageError(f"--submodule-repo {item!r}: expected SUBMODULE_PATH=REPOSITORY.")
        repos[path] = GitRepo(Path(repo))
    for sub in lock.aiter.submodules:
        if sub.path not in repos:
            repos[sub.path] = submodule_mirror(settings, sub.url)
    return repos


def _atom_tree(
    settings: Settings, lock: Lock, given: str | None, atom: GitRepo, aiter: GitRepo, patches_dir: Path | None
) -> str:
    """The patched ATOM commit: --atom-tree, else the series applied to the locked commit.

    The series is applied in the ATOM object store only (no work tree, no
    branch): the same commit `pipeline patch apply` makes. It must apply
    exactly the patches the lock records.
    """
    if given:
        sha = atom.rev_parse(given)
        if sha is None:
            raise UsageError(f"--atom-tree {given!r} is not a commit in {atom.path}.")
        return sha
    if not lock.applied_patches:
        return lock.atom.sha
    directory = patches_dir or Path(settings.paths.patches_dir)
    result = patched_commit(PatchSeries.load(directory), atom, lock.atom.sha, aiter, lock.aiter.sha)
    applied = [(p.name, p.sha256) for p in result.applied]
    recorded = [(p.name, p.sha256) for p in lock.applied_patches]
    if applied != recorded:
        names = ", ".join(n for n, _ in applied) or "nothing"
        raise PatchError(
            f"the patch series in {directory} applies {names} to ATOM {lock.atom.short}, but the lock "
            "records " + (", ".join(n for n, _ in recorded)) + " (names and sha256 must match).",
            hint=f"Run `pipeline patch apply --model {lock.model}` to record the series in the lock, "
            "then render again.",
        )
    return result.head_sha


def render_command(
    app: App,
    *,
    model: str,
    out_dir: Path,
    lock_path: Path | None = None,
    submodules: str | None = None,
    atom_repo: Path | None = None,
    aiter_repo: Path | None = None,
    atom_tree: str | None = None,
    submodule_repos: tuple[str, ...] = (),
    recipe: Path | None = None,
    patches_dir: Path | None = None,
) -> RenderedContext:
    """What `pipeline render` does; callable by the orchestrator."""
    settings = app.settings(submodules=submodules)
    validate_model(model)
    lock = Lock.load(lock_path or default_lock_path(Path(settings.paths.locks_dir), model))
    if lock.model != model:
        raise UsageError(f"the lock is for model {lock.model!r}, not {model!r}.")
    with app.log.stage("render", model) as rec:
        atom, aiter = _mirrors(settings, lock, atom_repo, aiter_repo)
        tree = _atom_tree(settings, lock, atom_tree, atom, aiter, patches_dir)
        recipe_path = recipe or Path(settings.paths.recipes_dir) / f"{model}.yaml"
        ctx = render_context(
            lock=lock,
            atom=atom,
            atom_tree_sha=tree,
            aiter=aiter,
            submodule_repos=_submodule_repos(settings, lock, submodule_repos),
            recipe_path=recipe_path,
            settings=settings,
            out_dir=out_dir,
            templates_dir=Path(settings.paths.templates_dir),
            source_date_epoch=source_date_epoch(app.env),
        )
        rec.figure = f"inputs {ctx.inputs_digest[:12]}"
        app.log.detail(f"Dockerfile: {ctx.dockerfile}")
    return ctx


@click.command(name="render")
@click.option("--model", required=True, help="Model whose lock to render, e.g. MiniMax-M3-MXFP4.")
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
    ctx = render_command(
        app,
        model=model,
        out_dir=out_dir,
        lock_path=lock_path,
        submodules=submodules,
        atom_repo=atom_repo,
        aiter_repo=aiter_repo,
        atom_tree=atom_tree,
        submodule_repos=submodule_repos,
        recipe=recipe,
        patches_dir=patches_dir,
    )
    if as_json:
        app.emit_json(
            {
                "context": str(ctx.dir),
                "dockerfile": str(ctx.dockerfile),
                "inputs_digest": ctx.inputs_digest,
                "image_ref": ctx.image_ref,
                "labels": ctx.labels,
                "parity": ctx.parity_summary,
            }
        )
    else:
        app.echo(f"{ctx.dir}  inputs {ctx.inputs_digest[:12]}  → {ctx.image_ref}")
        app.echo(f"{ctx.parity_summary} (see {ctx.dir / 'parity.md'})")
