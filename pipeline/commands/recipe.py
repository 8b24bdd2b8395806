"""`pipeline recipe import|drift`: our recipes from upstream's markdown, and what changed upstream."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.app import App, pass_app
from pipeline.errors import ConfigError
from pipeline.fsutil import atomic_write_text


@click.group(name="recipe")
def command() -> None:
    """Import upstream ATOM recipes (recipes/*.md) and report their drift."""


@command.command(name="import")
@click.argument("markdown", metavar="recipes/<Name>.md")
@click.option(
    "--atom", "atom_ref", metavar="REF", help="ATOM ref to read it at (default: [sources] atom_ref)."
)
@click.option("--atom-repo", metavar="URL|PATH", help="ATOM repository (default: [sources] atom_repo).")
@click.option(
    "--variant", "variants", multiple=True, metavar="NAME", help="Import only this variant (repeatable)."
)
@click.option(
    "-o",
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write <variant>.yaml (default: paths.recipes_dir).",
)
@click.option("--force", is_flag=True, help="Overwrite recipes that exist.")
@click.option("--dry-run", is_flag=True, help="Print the recipes instead of writing them.")
@pass_app
def import_(
    app: App,
    markdown: str,
    atom_ref: str | None,
    atom_repo: str | None,
    variants: tuple[str, ...],
    output_dir: Path | None,
    force: bool,
    dry_run: bool,
) -> None:
    """Write our YAML recipe for each MI355 variant of upstream's MARKDOWN at a pinned ATOM.

    \b
    Each is validated by the recipe schema and carries `source: ROCm/ATOM <file> @ <sha>`
    and a comment on every field that had to be inferred. A line it cannot read is an
    error naming it (exit 2), and then nothing is written.
    """
    from pipeline.recipes.upstream import import_recipes
    from pipeline.sources.repos import open_repo

    settings = app.settings(atom_repo=atom_repo, atom_ref=atom_ref)
    atom = open_repo(settings, settings.sources.atom_repo, "ATOM")
    got, notes = import_recipes(atom, settings.sources.atom_ref, markdown, only=variants)
    for n in notes:
        app.log.info(n)
    if not got:
        raise ConfigError(f"{markdown} has no MI355 variant that launches atom.entrypoints.openai_server.")
    out_dir = output_dir or Path(settings.paths.recipes_dir)
    targets = [(out_dir / f"{v.name}.yaml", text) for v, text in got]
    clash = [str(p) for p, _ in targets if p.exists()]
    if clash and not force and not dry_run:
        raise ConfigError(f"{', '.join(clash)} exist(s).", hint="Pass --force to overwrite, or -o DIR.")
    for path, text in targets:
        if dry_run:
            app.echo(text)
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        app.log.info(f"wrote {path}")


@command.command(name="drift")
@click.option(
    "--atom", "atom_ref", metavar="REF", help="The newly pinned ATOM (default: [sources] atom_ref)."
)
@click.option("--atom-repo", metavar="URL|PATH", help="ATOM repository (default: [sources] atom_repo).")
@click.option("--model", "models", multiple=True, metavar="M", help="Only this recipe (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the drift as JSON on stdout.")
@pass_app
def drift(
    app: App, atom_ref: str | None, atom_repo: str | None, models: tuple[str, ...], as_json: bool
) -> None:
    """Re-read each recipe's upstream source at a newer ATOM: what changed, and which commit changed it.

    \b
    Compares server flags, environment and reference numbers between the commit in the
    recipe's `source:` line and --atom; names the upstream commit of each change, or the
    one that removed the source. Exit 0 (drift is a report, not a failure).
    """
    from pipeline.recipes.drift import drift_all, drift_text
    from pipeline.sources.repos import open_repo

    settings = app.settings(atom_repo=atom_repo, atom_ref=atom_ref)
    atom = open_repo(settings, settings.sources.atom_repo, "ATOM")
    drifts = drift_all(atom, Path(settings.paths.recipes_dir), settings.sources.atom_ref, models)
    if as_json:
        app.emit_json([d.to_json() for d in drifts])
    else:
        app.echo(drift_text(drifts).rstrip("\n"))
    changed = sum(1 for d in drifts if d.changed)
    app.log.info(f"{len(drifts)} recipe(s) read, {changed} with upstream drift")
