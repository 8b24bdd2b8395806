"""`pipeline check`: every ATOM call of an aiter function against aiter's signatures.

Reads both repositories from git objects (no checkout, no import, no torch).
Exit 0 when compatible, 4 (`IncompatibleError`) when an error-severity finding
exists, after printing the report; usage and source problems keep their codes.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click

from pipeline.app import App, pass_app
from pipeline.compat import CheckReport, run_check
from pipeline.compat.reach import Reach, gate_model
from pipeline.config import Settings
from pipeline.errors import ConfigError, IncompatibleError, SourceError, UsageError
from pipeline.fsutil import atomic_write_text
from pipeline.gitw import GitRepo
from pipeline.lock import Lock
from pipeline.patchq import PatchSeries, patched_commit
from pipeline.recipe import find_recipe, load_recipe
from pipeline.sources import is_local, mirrors_for_lock, open_mirror


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
    if lock_path is not None and (atom_ref or aiter_ref):
        raise UsageError(
            "--lock and --atom/--aiter both name the commits to check.",
            hint="Give either a lock file or explicit refs.",
        )
    settings = app.settings(
        atom_repo=atom_repo, aiter_repo=aiter_repo, atom_ref=atom_ref, aiter_ref=aiter_ref
    )
    log = app.log
    if lock_path is not None:
        lock = Lock.load(lock_path)
        atom, aiter = _repos_for_lock(settings, lock, atom_repo, aiter_repo)
        atom_rev, aiter_rev = lock.atom.sha, lock.aiter.sha
        dated_by: str | None = None
        if lock.applied_patches and not unpatched:
            series = PatchSeries.load(patches_dir or Path(settings.paths.patches_dir))
            applied = patched_commit(series, atom, lock.atom.sha, aiter, lock.aiter.sha)
            if {p.name for p in applied.applied} != {p.name for p in lock.applied_patches}:
                log.warn(
                    "the patch series applies differently from what the lock records "
                    f"({', '.join(p.name for p in applied.applied) or 'none'} now, "
                    f"{', '.join(p.name for p in lock.applied_patches)} in the lock); "
                    "checking the series as it applies now."
                )
            atom_rev, dated_by = applied.head_sha, lock.atom.sha
            log.detail(f"checking the patched ATOM tree {atom_rev[:10]} ({len(applied.applied)} patch(es))")
    else:
        atom = open_repo(settings, settings.sources.atom_repo, "ATOM")
        aiter = open_repo(settings, settings.sources.aiter_repo, "aiter")
        atom_rev, aiter_rev = settings.sources.atom_ref, settings.sources.aiter_ref
        dated_by = None

    with log.stage("check", f"ATOM {atom_rev[:12]} × aiter {aiter_rev[:12]}") as rec:
        report = run_check(
            atom,
            atom_rev,
            aiter,
            aiter_rev,
            baseline_aiter_rev=baseline_aiter,
            cache_dir=settings.cache_dir / "compat",
            dated_by=dated_by,
        )
        rec.figure = (
            f"{len(report.errors)} error(s), {len(report.warnings)} warning(s), "
            f"{report.calls_checked} calls checked, {report.calls_unchecked} unchecked"
        )
        recipes_dir = Path(settings.paths.recipes_dir)
        reach: Reach | None = None
        if recipe_path is None and model is not None:
            recipe_path = find_recipe(model, recipes_dir)  # named explicitly: a missing one is an error
        if recipe_path is None and lock_path is not None:
            with contextlib.suppress(ConfigError):  # no recipe for the model: nothing to waive
                recipe_path = find_recipe(lock.model, recipes_dir)
        if recipe_path is not None:
            gate = gate_model(
                report,
                atom,
                load_recipe(recipe_path),
                cache_dir=settings.cache_dir / "compat",
                waivers=not no_waivers,
            )
            report, reach = gate.report, gate.reach
            if gate.reach is not None:
                off = sum(1 for f in report.findings if f.reach == "off-path")
                rec.figure += f", {off} off {gate.reach.facts.architecture}'s path"
                log.detail(gate.reach.edges_summary())
            if gate.waived:
                rec.figure += f", {gate.waived} waived by {recipe_path.name}"
            for msg in gate.warnings:
                log.warn(msg)
            for note in gate.notes:
                log.warn(note.message)
        if not report.ok:
            rec.status = "failed"

    text = render(report, fmt, reach=reach)
    if output is not None:
        atomic_write_text(output, text)
        log.info(f"report written to {output}")
    else:
        click.echo(app.log.redact(text), nl=False)
    if log.github:
        for f in report.errors:
            log.error(f.message, file=f.path, line=f.line)
    if not report.ok:
        raise IncompatibleError(
            f"ATOM {report.atom_sha[:10]} is not compatible with aiter {report.aiter_sha[:10]}: "
            f"{len(report.errors)} breaking call(s).",
            hint="Pin another aiter (`pipeline pin --auto` finds the newest compatible one) "
            "or add a patch for ATOM (`pipeline patch`).",
        )


def render(report: CheckReport, fmt: str, *, reach: Reach | None = None) -> str:
    if fmt == "json":
        data = report.to_json()
        if reach is not None:
            data["reach"] = reach.to_json()  # the model, its module, the edges followed and the rules
        return json.dumps(data, indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(report.to_sarif(), indent=2) + "\n"
    text = report.to_text() + "\n"
    return text + (f"reach: {reach.edges_summary()}\n" if reach is not None else "")


def open_repo(settings: Settings, url: str, name: str) -> GitRepo:
    """A local repository as it is (work tree or bare, patched branches included), else its mirror."""
    path = Path(url).expanduser()
    if is_local(url) and path.exists():
        return GitRepo(path)
    if is_local(url):
        raise SourceError(
            f"the {name} repository path {url} does not exist.",
            hint=f"Check --{name.lower()}-repo, pipeline.toml or PIPELINE_{name.upper()}_REPO.",
        )
    return open_mirror(settings, url, fetch=False)


def _repos_for_lock(
    settings: Settings, lock: Lock, atom_repo: str | None, aiter_repo: str | None
) -> tuple[GitRepo, GitRepo]:
    if not atom_repo and not aiter_repo:
        return mirrors_for_lock(settings, lock)
    atom = open_repo(settings, atom_repo or lock.atom.url, "ATOM")
    aiter = open_repo(settings, aiter_repo or lock.aiter.url, "aiter")
    for repo, pin, name in ((atom, lock.atom, "ATOM"), (aiter, lock.aiter, "aiter")):
        if repo.rev_parse(pin.sha) is None:
            raise SourceError(
                f"the locked {name} commit {pin.sha} is not in {repo.path}.",
                hint="Run `pipeline pin` again, or point --atom-repo/--aiter-repo at a repository "
                "that has it.",
            )
    return atom, aiter
