"""`pipeline gc`: remove old runs, orphaned locks and pins no lock file names (see pipeline.gc)."""

from __future__ import annotations

import click

from pipeline.app import App, pass_app
from pipeline.errors import UsageError


@click.command(name="gc")
@click.option(
    "--older-than",
    "days",
    type=float,
    default=30.0,
    show_default=True,
    metavar="DAYS",
    help="Remove run directories unchanged for this many days.",
)
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as a JSON object on stdout.")
@pass_app
def command(app: App, days: float, dry_run: bool, as_json: bool) -> None:
    """Remove run directories older than DAYS or beyond the newest [paths] keep_runs, lock files
    and temp dirs nobody holds, and `refs/pins/*` in the mirrors that no lock file (in locks_dir
    or a kept run) names. Every command that opens a run already keeps only the newest
    keep_runs runs; schedule `pipeline gc` (e.g. daily) for the rest.

    Nothing another process is using is touched; --dry-run lists without removing.
    """
    from pipeline import gc

    if days < 0:
        raise UsageError(
            f"--older-than must be 0 or more days, not {days:g}.", hint="For example: --older-than 30."
        )
    settings = app.settings()
    found = gc.plan(settings, older_than_days=days, keep_newest=settings.paths.keep_runs)
    removed = 0 if dry_run else gc.execute(found, settings, app.log)
    if as_json:
        app.emit_json(
            {
                "dry_run": dry_run,
                "removed": removed,
                "items": [
                    {"kind": i.kind, "path": str(i.path), "ref": i.ref or None, "detail": i.detail}
                    for i in found.items
                ],
                "kept": found.kept,
            }
        )
        return
    lines = [("would remove " if dry_run else "") + i.line() for i in found.items]
    lines += [f"kept {k}" for k in found.kept]
    counts = ", ".join(f"{found.count(k)} {k}(s)" for k in ("run", "lock", "tmp", "pin"))
    verb = "would remove" if dry_run else f"removed {removed} of"
    lines.append(f"gc: {verb} {len(found.items)} item(s): {counts}")
    app.echo("\n".join(lines))
