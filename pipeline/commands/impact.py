"""`pipeline impact`: which ATOM calls an aiter change breaks (the aiter side of `pipeline check`).

Exit 0 when nothing on a model's path breaks, 4 (`IncompatibleError`) when something does,
after printing the report; usage and source problems keep their codes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipeline import validate
from pipeline.app import App, pass_app
from pipeline.errors import ConfigError, IncompatibleError
from pipeline.fsutil import atomic_write_text

if TYPE_CHECKING:
    from pipeline.compat.impact import ModelSpec
    from pipeline.config import Settings
    from pipeline.gitw import GitRepo
    from pipeline.lock import Lock


@click.command(name="impact")
@click.option("--aiter-base", "base", required=True, metavar="REF", help="aiter before the change (PR base).")
@click.option("--aiter-head", "head", required=True, metavar="REF", help="aiter after the change (PR head).")
@click.option(
    "--atom",
    "atom_refs",
    multiple=True,
    metavar="REF",
    help="ATOM ref to check (repeatable). Default: the configured atom_ref (main) and the ATOM "
    "of every lock under the locks directory.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="M",
    help="Place each break on or off this model's path (repeatable; recipes/M.yaml). Default: every recipe.",
)
@click.option("--atom-repo", metavar="URL|PATH", help="ATOM repository (any git URL or a local path).")
@click.option("--aiter-repo", metavar="URL|PATH", help="aiter repository (any git URL or a local path).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "sarif"]),
    default="text",
    show_default=True,
    help="Report format (sarif: primary locations in aiter, the ATOM call sites related).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report to this file (atomically) instead of stdout.",
)
@pass_app
def command(
    app: App,
    base: str,
    head: str,
    atom_refs: tuple[str, ...],
    models: tuple[str, ...],
    atom_repo: str | None,
    aiter_repo: str | None,
    fmt: str,
    output: Path | None,
) -> None:
    """Which ATOM calls an aiter change (--aiter-base..--aiter-head) breaks.

    \b
    For ATOM at each ref, the calls that bind at the base and break at the head, each
    with the aiter commit in the range that broke it, grouped by the aiter definition
    (file and line), and per model whether the call is on its path.
    Exit 0 when nothing on a model's path breaks, 4 when something does.
    """
    from pipeline.compat.impact import run_impact, with_links
    from pipeline.gitw import GitRepo
    from pipeline.sources.repos import repo_path

    settings = app.settings(atom_repo=atom_repo, aiter_repo=aiter_repo)
    validate.ref(base, what="aiter base ref")
    validate.ref(head, what="aiter head ref")
    atom = GitRepo(repo_path(settings, settings.sources.atom_repo, "ATOM"))
    aiter = GitRepo(repo_path(settings, settings.sources.aiter_repo, "aiter"))
    refs = [(validate.ref(r, what="ATOM ref"), r) for r in atom_refs]
    refs = refs or _default_atoms(app, settings, atom, aiter)
    specs = _models(settings, models)
    cache = settings.cache_dir / "compat"
    with app.log.stage("impact", f"aiter {base[:12]}..{head[:12]} × {len(refs)} ATOM commit(s)") as rec:
        report = run_impact(atom, refs, aiter, base, head, models=specs, cache_dir=cache)
        rec.figure = report.summary()
        if report.breaks_on_path:
            rec.status = "failed"
    report = with_links(report, settings.sources.atom_repo, settings.sources.aiter_repo)
    import json

    if fmt == "json":
        text = json.dumps(report.to_json(), indent=2) + "\n"
    elif fmt == "sarif":
        text = json.dumps(report.to_sarif(), indent=2) + "\n"
    else:
        text = report.to_text() + "\n"
    if output is not None:
        atomic_write_text(output, text)
        app.log.info(f"report written to {output}")
    else:
        click.echo(app.log.redact(text), nl=False)
    if app.log.github:  # annotations on the aiter side: the definitions whose change breaks ATOM
        for d in report.definitions:
            if report.gates(d):
                sites = ", ".join(f"{s.finding.path}:{s.finding.line}" for s in d.sites)
                app.log.error(f"`{d.name}` breaks ATOM calls: {sites}", file=d.path, line=d.line)
    if report.breaks_on_path:
        raise IncompatibleError(
            f"aiter {report.aiter_head[:10]} breaks ATOM calls that bind at {report.aiter_base[:10]}: "
            f"{report.summary()}.",
            hint="Keep the old signature working in aiter (a keyword-only new parameter, a default), or "
            "fix the ATOM call sites first; `pipeline patch draft` drafts the ATOM side.",
        )


def _default_atoms(app: App, settings: Settings, atom: GitRepo, aiter: GitRepo) -> list[tuple[str, str]]:
    """ATOM's configured branch, and the ATOM each lock under the locks directory pins (the patched
    tree when the lock records applied patches: what that image ships)."""
    refs = [(settings.sources.atom_ref, validate.ref(settings.sources.atom_ref, what="ATOM ref"))]
    locks_dir = Path(settings.paths.locks_dir)
    if not locks_dir.is_dir():
        return refs
    from pipeline.lock import Lock

    for path in sorted(locks_dir.glob("*.toml")):
        lock = Lock.load(path)
        rev = lock.atom.sha
        if lock.applied_patches:
            rev = _patched(app, settings, lock, atom.path, aiter.path)
        refs.append((f"lock {lock.model}", rev))
    return refs


def _patched(app: App, settings: Settings, lock: Lock, atom: Path, aiter: Path) -> str:
    from pipeline.stages import check
    from pipeline.stages.base import Context

    ctx = Context(settings=settings, log=app.log, env=app.env, work_dir=Path("."))
    inputs = check.inputs_from_lock(
        ctx, lock, atom_repo=atom, aiter_repo=aiter, patches_dir=None, unpatched=False, recipe=None
    )
    return inputs.atom_rev


def _models(settings: Settings, names: tuple[str, ...]) -> list[ModelSpec]:
    """Each model's reach facts from its recipe (named: the recipe must exist; default: every recipe)."""
    from pipeline.compat.impact import ModelSpec
    from pipeline.compat.reach import facts_from_command
    from pipeline.recipes.recipe import find_recipe, load_recipe

    recipes_dir = Path(settings.paths.recipes_dir)
    if names:
        paths = [find_recipe(validate.model(n), recipes_dir) for n in names]
    else:
        paths = sorted(recipes_dir.glob("*.yaml")) if recipes_dir.is_dir() else []
    out: list[ModelSpec] = []
    for p in paths:
        with contextlib.suppress(ConfigError) if not names else contextlib.nullcontext():
            recipe = load_recipe(p)
            arch = recipe.model.architecture
            facts = facts_from_command(arch, recipe.server.command) if arch else None
            out.append(ModelSpec(recipe.name, facts))
    return out
