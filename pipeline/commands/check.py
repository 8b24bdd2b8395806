"""`pipeline check`: every ATOM call of an aiter function against aiter's signatures.

Reads both repositories from git objects (no checkout, no import, no torch).
Exit 0 when compatible, 4 (`IncompatibleError`) when an error-severity finding
exists, after printing the report; usage and source problems keep their codes.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import click

from pipeline.app import App, pass_app
from pipeline.compat import CheckReport, run_check
from pipeline.config import Settings
from pipeline.errors import IncompatibleError, SourceError, UsageError
from pipeline.fsutil import atomic_write_text
from pipeline.gitw import GitRepo
from pipeline.lock import Lock


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
) -> None:
    """Check every ATOM call of an aiter function against aiter's signatures."""
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
        if lock.applied_patches:
            log.warn(
                f"{len(lock.applied_patches)} patch(es) are applied in this lock; this check reads the "
                "pinned ATOM commit. The patch stage runs the check on the patched tree."
            )
    else:
        atom = open_repo(settings, settings.sources.atom_repo, "ATOM")
        aiter = open_repo(settings, settings.sources.aiter_repo, "aiter")
        atom_rev, aiter_rev = settings.sources.atom_ref, settings.sources.aiter_ref

    with log.stage("check", f"ATOM {atom_rev} × aiter {aiter_rev}") as rec:
        report = run_check(
            atom,
            atom_rev,
            aiter,
            aiter_rev,
            baseline_aiter_rev=baseline_aiter,
            cache_dir=settings.cache_dir / "compat",
        )
        rec.figure = (
            f"{len(report.errors)} error(s), {len(report.warnings)} warning(s), "
            f"{report.calls_checked} calls checked, {report.calls_unchecked} unchecked"
        )
        if not report.ok:
            rec.status = "failed"

    text = render(report, fmt)
    if output is not None:
        atomic_write_text(output, text)
        log.info(f"report written to {output}")
    elif fmt == "text":
        app.echo(text)
    else:
        click.echo(app.log.redact(text))
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


def render(report: CheckReport, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_json(), indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(report.to_sarif(), indent=2) + "\n"
    return report.to_text() + "\n"


def open_repo(settings: Settings, url: str, name: str) -> GitRepo:
    """A local repository as it is (work tree or bare, patched branches included), else its mirror."""
    path = Path(url).expanduser()
    if path.exists():
        return GitRepo(path)
    sources = _sources_module()
    if sources is None:
        raise SourceError(
            f"the {name} repository {url} is not a local path, and this build has no mirror support.",
            hint=f"Pass a local clone with --{name.lower()}-repo PATH.",
        )
    repo: GitRepo = sources.open_mirror(settings, url, fetch=False)
    return repo


def _repos_for_lock(
    settings: Settings, lock: Lock, atom_repo: str | None, aiter_repo: str | None
) -> tuple[GitRepo, GitRepo]:
    sources = _sources_module()
    if sources is not None and not atom_repo and not aiter_repo:
        atom, aiter = sources.mirrors_for_lock(settings, lock)
        return atom, aiter
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


def _sources_module() -> Any:
    try:
        return importlib.import_module("pipeline.sources")
    except ImportError:
        return None
