"""`pipeline check`: every ATOM call of an aiter function against aiter's signatures.

Reads both repositories from git objects (no checkout, no import, no torch).
Exit 0 when compatible, 4 (`IncompatibleError`) when an error-severity finding
exists, after printing the report; usage and source problems keep their codes.
What it prints comes from `compat.verdict`, which `pipeline.plaincheck` prints
with too: the plain form is answered there, without click or pydantic, the same.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipeline import validate
from pipeline.app import App, pass_app
from pipeline.errors import UsageError
from pipeline.fsutil import atomic_write_text
from pipeline.stages.base import Context

if TYPE_CHECKING:
    from pipeline.stages.check import Inputs

# Lock files, patch series, recipes and mirrors are imported where they are used: a check of two
# local refs needs none of them (start-up time, issue 12 §5).


SUMMARY_LINES = 200  # of the text report in the job summary


@click.command(name="check")
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Check the commits pinned in this lock file.",
)
@click.option("--atom", "atom_ref", metavar="REF", help="ATOM ref (default: the configured atom_ref).")
@click.option("--aiter", "aiter_ref", metavar="REF", help="aiter ref (default: the configured aiter_ref).")
@click.option("--atom-repo", metavar="URL|PATH", help="ATOM repository (any git URL or a local path).")
@click.option("--aiter-repo", metavar="URL|PATH", help="aiter repository (any git URL or a local path).")
@click.option(
    "--baseline-aiter",
    metavar="REF",
    help="aiter the ATOM code was written against (e.g. the previous lock's). "
    "Default: aiter as of the ATOM commit's date, or as of each call's last change.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "sarif"]),
    default="text",
    show_default=True,
    help="Report format.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the report to this file (atomically) instead of stdout.",
)
@click.option(
    "--patches-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Patch series applied to ATOM when the lock records applied patches (default: paths.patches_dir).",
)
@click.option(
    "--unpatched",
    is_flag=True,
    help="Check the pinned ATOM commit as it is, even when the lock records applied patches.",
)
@click.option(
    "--recipe",
    "recipe_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Apply this recipe's reviewed waivers (default with --lock: recipes/<model>.yaml if present).",
)
@click.option(
    "--model",
    "model",
    metavar="M",
    help="Gate for this model (recipes/M.yaml): findings off its code path are warnings. "
    "Default with --lock: the lock's model.",
)
@click.option("--no-waivers", is_flag=True, help="Report waived findings as the errors they are.")
@pass_app
def command(
    app: App,
    lock_path: Path | None,
    atom_ref: str | None,
    aiter_ref: str | None,
    atom_repo: str | None,
    aiter_repo: str | None,
    baseline_aiter: str | None,
    fmt: str,
    output: Path | None,
    patches_dir: Path | None,
    unpatched: bool,
    recipe_path: Path | None,
    model: str | None,
    no_waivers: bool,
) -> None:
    """Check every ATOM call of an aiter function against aiter's signatures.

    \b
    With --lock: the locked commits; when the lock records applied patches, the
    patched ATOM tree (the same commit `pipeline patch` makes, no work tree).
    Without: --atom/--aiter refs (default: the configured refs) in
    --atom-repo/--aiter-repo (a local path is read as it is; a URL through its mirror).
    Exit 0 compatible, 4 incompatible (after the report), 2 usage, 3 source problems.
    """
    from pipeline.compat import verdict
    from pipeline.sources.repos import repo_path
    from pipeline.stages import check

    if lock_path is not None and (atom_ref or aiter_ref):
        raise UsageError(
            "--lock and --atom/--aiter both name the commits to check.",
            hint="Give either a lock file or explicit refs.",
        )
    settings = app.settings(
        atom_repo=atom_repo, aiter_repo=aiter_repo, atom_ref=atom_ref, aiter_ref=aiter_ref
    )
    log = app.log
    if recipe_path is None and model is not None:  # named explicitly: a missing recipe is an error
        from pipeline.recipes.recipe import find_recipe

        recipe_path = find_recipe(validate.model(model), Path(settings.paths.recipes_dir))
    if lock_path is not None:
        from pipeline.lock import Lock

        inputs = check.inputs_from_lock(
            Context(settings=settings, log=log, env=app.env, work_dir=Path(".")),
            Lock.load(lock_path),
            atom_repo=repo_path(settings, atom_repo, "ATOM") if atom_repo else None,
            aiter_repo=repo_path(settings, aiter_repo, "aiter") if aiter_repo else None,
            patches_dir=patches_dir,
            unpatched=unpatched,
            recipe=recipe_path,
            lock_path=lock_path,
        )
    else:
        inputs = check.Inputs(
            model=model or "",
            atom_rev=validate.ref(settings.sources.atom_ref, what="ATOM ref"),
            aiter_rev=validate.ref(settings.sources.aiter_ref, what="aiter ref"),
            atom_repo=repo_path(settings, settings.sources.atom_repo, "ATOM"),
            aiter_repo=repo_path(settings, settings.sources.aiter_repo, "aiter"),
            recipe=recipe_path,
            reports_dir=Path("."),
        )
    inputs = inputs.model_copy(update={"baseline_aiter": baseline_aiter, "waivers": not no_waivers})
    with tempfile.TemporaryDirectory(prefix="pipeline-check-") as reports:
        inputs = inputs.model_copy(update={"reports_dir": Path(reports)})
        ctx = Context(settings=settings, log=log, env=app.env, work_dir=Path(reports))
        failed = verdict.staged(log, inputs.atom_rev, inputs.aiter_rev, lambda: _figure(ctx, inputs))
        text = (Path(reports) / verdict.REPORT_FILES[fmt]).read_text(encoding="utf-8")
        # the job summary on GitHub Actions ($GITHUB_STEP_SUMMARY), as `build` writes one
        report = (Path(reports) / "check.txt").read_text(encoding="utf-8").splitlines()
        shown = report[:SUMMARY_LINES] + (
            [f"... ({len(report) - SUMMARY_LINES} more lines)"] if len(report) > SUMMARY_LINES else []
        )
        log.publish_summary("pipeline check", "```\n" + "\n".join(shown) + "\n```\n")
    if output is not None:
        atomic_write_text(output, text)
        log.info(f"report written to {output}")
    else:
        click.echo(app.log.redact(text), nl=False)
    if failed is not None:
        raise failed


def _figure(ctx: Context, inputs: Inputs) -> str:
    """The check stage's run, for the stage line (`compat.verdict.staged`)."""
    from pipeline.stages import check

    return check.run(ctx, inputs).figure()
