"""`pipeline render`: write the Dockerfile and build context for a model from its lock."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from pipeline.app import App, pass_app
from pipeline.config import Settings
from pipeline.errors import UsageError
from pipeline.gitw import GitRepo
from pipeline.lock import Lock, default_lock_path
from pipeline.render import RenderedContext, check_model, render_context


def _optional(module: str) -> Any:
    """A module another stage provides, or None while it is not merged yet."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


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
    if atom_repo is not None and aiter_repo is not None:
        return GitRepo(atom_repo), GitRepo(aiter_repo)
    sources = _optional("pipeline.sources")
    if sources is None or not hasattr(sources, "mirrors_for_lock"):
        raise UsageError(
            "this build of the pipeline cannot find the mirrors by itself yet.",
            hint="Pass --atom-repo PATH and --aiter-repo PATH (local clones or mirrors holding the locked "
            "commits).",
        )
    atom, aiter = sources.mirrors_for_lock(settings, lock)
    return GitRepo(atom_repo) if atom_repo else atom, GitRepo(aiter_repo) if aiter_repo else aiter


def _submodule_repos(settings: Settings, lock: Lock, given: tuple[str, ...]) -> dict[str, GitRepo | None]:
    repos: dict[str, GitRepo | None] = {}
    for item in given:
        path, sep, repo = item.partition("=")
        if not sep or not path or not repo:
            raise UsageError(f"--submodule-repo {item!r}: expected SUBMODULE_PATH=REPOSITORY.")
        repos[path] = GitRepo(Path(repo))
    sources = _optional("pipeline.sources")
    for sub in lock.aiter.submodules:
        if sub.path not in repos:
            finder = getattr(sources, "submodule_mirror", None) if sources is not None else None
            repos[sub.path] = finder(settings, sub.url) if finder is not None else None
    return repos


def _atom_tree(lock: Lock, given: str | None, atom: GitRepo) -> str:
    """The patched ATOM commit: --atom-tree, else the branch `pipeline patch` left for this lock."""
    if given:
        sha = atom.rev_parse(given)
        if sha is None:
            raise UsageError(f"--atom-tree {given!r} is not a commit in {atom.path}.")
        return sha
    if not lock.applied_patches:
        return lock.atom.sha
    patchq = _optional("pipeline.patchq.apply")
    branch_name = getattr(patchq, "branch_name", None) if patchq is not None else None
    if branch_name is None:
        raise UsageError(
            f"the lock applies {len(lock.applied_patches)} patch(es) and this build of the pipeline cannot "
            "find the patched commit by itself yet.",
            hint="Run `pipeline patch` and pass the patched ATOM commit with --atom-tree SHA.",
        )
    branch = str(branch_name(lock.atom.sha, lock.patches))
    sha = atom.rev_parse(f"refs/heads/{branch}")
    if sha is None:
        raise UsageError(
            f"no patched ATOM commit for this lock in {atom.path} (branch {branch}).",
            hint=f"Run `pipeline patch --model {lock.model}` first, or pass --atom-tree SHA.",
        )
    return sha


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
) -> RenderedContext:
    """What `pipeline render` does; callable by the orchestrator."""
    settings = app.settings(submodules=submodules)
    check_model(model)
    lock = Lock.load(lock_path or default_lock_path(Path(settings.paths.locks_dir), model))
    if lock.model != model:
        raise UsageError(f"the lock is for model {lock.model!r}, not {model!r}.")
    with app.log.stage("render", model) as rec:
        atom, aiter = _mirrors(settings, lock, atom_repo, aiter_repo)
        tree = _atom_tree(lock, atom_tree, atom)
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
    help="Local ATOM repository/mirror holding the locked (and patched) commits.",
)
@click.option(
    "--aiter-repo",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Local aiter repository/mirror holding the locked commit.",
)
@click.option(
    "--atom-tree",
    help="The patched ATOM commit (from `pipeline patch`); default: the locked commit "
    "when the lock applies no patch.",
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
    )
    if as_json:
        app.emit_json(
            {
                "context": str(ctx.dir),
                "dockerfile": str(ctx.dockerfile),
                "inputs_digest": ctx.inputs_digest,
                "image_ref": ctx.image_ref,
                "labels": ctx.labels,
            }
        )
    else:
        app.echo(f"{ctx.dir}  inputs {ctx.inputs_digest[:12]}  → {ctx.image_ref}")
