"""`pipeline patch`: list, check, apply, import, export and add to the ATOM patch series."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pipeline import validate
from pipeline.app import App, pass_app
from pipeline.errors import PatchError, UsageError
from pipeline.lock import Lock, updating
from pipeline.patchq.model import AITER_AFTER, AITER_REQUIRES, RANGE, VERSION, PatchSeries

if TYPE_CHECKING:
    from pipeline.gitw import GitRepo

F = TypeVar("F", bound=Callable[..., Any])


def _dir_option(f: F) -> F:
    return click.option(
        "--patches-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Directory holding `series` and the patches (default: paths.patches_dir).",
    )(f)


def _lock_options(f: F) -> F:
    f = click.option(
        "--lock",
        "lock_file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Lock file (default: locks/<model>.toml).",
    )(f)
    f = click.option("--model", help="Model whose lock to use (locks/<model>.toml).")(f)
    return f


def _repo_options(f: F) -> F:
    f = click.option(
        "--atom-repo",
        type=click.Path(file_okay=False, path_type=Path),
        help="ATOM repository or mirror (default: the mirror of the locked source).",
    )(f)
    f = click.option(
        "--aiter-repo",
        type=click.Path(file_okay=False, path_type=Path),
        help="aiter repository or mirror (default: the mirror of the locked source).",
    )(f)
    return f


def _worktree_option(help: str) -> Callable[[F], F]:
    """`--repo`: the ATOM work tree that import, export and new work in."""
    return click.option("--repo", type=click.Path(file_okay=False, path_type=Path), required=True, help=help)


def _patches_dir(app: App, patches_dir: Path | None) -> Path:
    return patches_dir or Path(app.settings().paths.patches_dir)


def _series(app: App, patches_dir: Path | None) -> PatchSeries:
    return PatchSeries.load(_patches_dir(app, patches_dir))


def _lock_path(app: App, lock_file: Path | None, model: str | None) -> Path:
    if lock_file is not None:
        return lock_file
    locks_dir = Path(app.settings().paths.locks_dir)
    if model:
        return locks_dir / f"{validate.model(model)}.toml"
    found = sorted(locks_dir.glob("*.toml")) if locks_dir.is_dir() else []
    if len(found) == 1:
        return found[0]
    raise UsageError(
        f"which lock? {len(found)} lock files in {locks_dir}.",
        hint="Pass --model MODEL or --lock FILE.",
    )


def _locked_atom(app: App, lock_file: Path | None, model: str | None) -> str:
    """The ATOM commit of the lock (`--lock` / `--model`): the default base of import, export and new."""
    return Lock.load(_lock_path(app, lock_file, model)).atom.sha


def _repos(app: App, lock: Lock, atom_repo: Path | None, aiter_repo: Path | None) -> tuple[GitRepo, GitRepo]:
    from pipeline.stages import patch
    from pipeline.stages.base import Context

    ctx = Context(settings=app.settings(), log=app.log, env=app.env, work_dir=Path("."))
    atom, aiter = patch.repos(ctx, lock, atom_repo, aiter_repo)
    return atom, aiter


@click.group(name="patch")
def command() -> None:
    """List, check, apply and edit the ATOM patch series (patches/atom/series).

    \b
    pipeline patch list                       the series and each patch's range
    pipeline patch check                      status of each patch for the locked commits
    pipeline patch apply                      commits at refs/pipeline/patched/<atom7>-<series7>
    pipeline patch import --repo WT           the series as commits on a branch, to edit
    pipeline patch export --repo WT           those commits back into patch files + series
    pipeline patch new --repo WT              one commit appended as the next patch
    pipeline patch draft                      draft the fix of each mechanical break (Status: draft)
    """


@command.command(name="list")
@_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def list_cmd(app: App, patches_dir: Path | None, as_json: bool) -> None:
    """The series in order, with each patch's version, ATOM range and aiter condition."""
    series = _series(app, patches_dir)
    if as_json:
        app.emit_json(
            {
                "series": str(series.series_file),
                "digest": series.digest(),
                "patches": [
                    {
                        "name": p.name,
                        "sha256": p.sha256,
                        "version": p.version,
                        "subject": p.subject,
                        "atom_range": str(p.atom_range),
                        "aiter_after": p.aiter_after,
                        "aiter_requires": [str(r) for r in p.aiter_requires],
                        "files": list(p.paths),
                        "origin": p.field("Origin"),
                        "forwarded": p.field("Forwarded"),
                        "applied_upstream": p.field("Applied-Upstream"),
                    }
                    for p in series
                ],
            }
        )
        return
    if not len(series):
        app.echo(f"{series.series_file}: empty series")
        return
    for p in series:
        app.echo(f"{p.name}  v{p.version}  {p.subject}")
        app.echo(f"    ATOM range: {p.atom_range}   files: {', '.join(p.paths)}")
        conds = ([f"aiter contains {p.aiter_after}"] if p.aiter_after else []) + [
            str(r) for r in p.aiter_requires
        ]
        if conds:
            app.echo(f"    needed when: {'; '.join(conds)}")
        if p.field("Applied-Upstream"):
            app.echo(f"    applied upstream: {p.field('Applied-Upstream')}")


@command.command(name="check")
@_dir_option
@_lock_options
@_repo_options
@click.option("--atom", "atom_rev", help="Check against this ATOM commit instead of the locked one.")
@click.option("--aiter", "aiter_rev", help="Check against this aiter commit instead of the locked one.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def check_cmd(
    app: App,
    patches_dir: Path | None,
    lock_file: Path | None,
    model: str | None,
    atom_repo: Path | None,
    aiter_repo: Path | None,
    atom_rev: str | None,
    aiter_rev: str | None,
    as_json: bool,
) -> None:
    """Each patch: applies, not-needed, already-upstream or conflict (exit 5 on a conflict)."""
    from pipeline.gitw import GitRepo
    from pipeline.patchq import check_series

    series = _series(app, patches_dir)
    lock = None
    if atom_rev is None or aiter_rev is None or atom_repo is None or aiter_repo is None:
        lock = Lock.load(_lock_path(app, lock_file, model))
    if lock is not None:
        atom, aiter = _repos(app, lock, atom_repo, aiter_repo)
    else:
        assert atom_repo is not None and aiter_repo is not None
        atom, aiter = GitRepo(atom_repo), GitRepo(aiter_repo)
    atom_sha = atom_rev or (lock.atom.sha if lock else "")
    aiter_sha = aiter_rev or (lock.aiter.sha if lock else "")
    stale = _stale_pins(lock, series) if lock else []
    with app.log.stage("patch check") as rec:
        checks = check_series(series, atom, atom_sha, aiter, aiter_sha)
        counts = {
            s: sum(c.status == s for c in checks)
            for s in ("applies", "not-needed", "already-upstream", "conflict")
        }
        rec.figure = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "empty series"
        if as_json:
            app.emit_json(
                {
                    "atom": atom.rev_parse(atom_sha),
                    "aiter": aiter.rev_parse(aiter_sha),
                    "patches": [c.to_json() for c in checks],
                    "stale_lock_entries": stale,
                }
            )
        else:
            for c in checks:
                app.echo(c.line())
        for s in stale:
            app.log.warn(s)
        conflicts = [c for c in checks if c.status == "conflict"]
        if conflicts:
            raise PatchError(
                f"{len(conflicts)} patch(es) conflict with ATOM {atom_sha[:9]}: "
                + ", ".join(c.patch.name for c in conflicts)
                + ".",
                hint="Refresh them (`pipeline patch import`, fix, `pipeline patch export`) or narrow their "
                f"{RANGE}.",
                evidence="\n".join(c.line() for c in conflicts),
            )


def _stale_pins(lock: Lock, series: PatchSeries) -> list[str]:
    files = {p.name: p.sha256 for p in series}
    out = []
    for pin in lock.patches:
        if pin.name not in files:
            out.append(
                f"the lock records {pin.name}, which is no longer in the series; run `pipeline patch apply`."
            )
        elif files[pin.name] != pin.sha256:
            out.append(f"{pin.name} changed since the lock recorded it; run `pipeline patch apply`.")
    return out


@command.command(name="apply")
@_dir_option
@_lock_options
@_repo_options
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the patched work tree goes (default: <cache_dir>/patched).",
)
@click.option("--no-lock-update", is_flag=True, help="Do not record the patches in the lock file.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def apply_cmd(
    app: App,
    patches_dir: Path | None,
    lock_file: Path | None,
    model: str | None,
    atom_repo: Path | None,
    aiter_repo: Path | None,
    workdir: Path | None,
    no_lock_update: bool,
    as_json: bool,
) -> None:
    """Apply the needed patches to the locked ATOM commit (one commit each, all or nothing).

    Prints the patched commit SHA. Patches that are not needed (outside
    their range or aiter condition) or already upstream are dropped with a
    note. The lock's `patches` entries record what was applied (sha256).
    """
    from pipeline.stages import patch

    lock_path = _lock_path(app, lock_file, model)
    # held until the command ends: a pin of this lock file meanwhile gets exit 13
    lock = click.get_current_context().with_resource(updating(lock_path)) or Lock.load(lock_path)
    ctx = app.context()
    inputs = patch.Inputs(
        lock=lock,
        patches_dir=_patches_dir(app, patches_dir),
        out=None if no_lock_update else lock_path,
        atom_repo=atom_repo,
        aiter_repo=aiter_repo,
        workdir=workdir or ctx.settings.cache_dir / "patched",
    )
    with app.log.stage("patch apply") as rec:
        out = patch.run(ctx, inputs)
        rec.figure = out.figure()
    if as_json:
        app.emit_json(
            {
                "head": out.head,
                "branch": out.branch,
                "worktree": out.worktree,
                "patches": [p.model_dump() for p in out.lock.patches],
                "notes": list(out.notes),
            }
        )
    else:
        where = f"  (branch {out.branch} in {out.worktree})" if out.branch and out.worktree else ""
        app.echo(f"patched ATOM: {out.head}{where}")


@command.command(name="import")
@_dir_option
@_lock_options
@_worktree_option("An ATOM work tree (clean) to create the branch in.")
@click.option("--base", help="Commit to start from (default: the locked ATOM commit).")
@click.option("--branch", help="Branch to create (default: patch-queue/<base7>).")
@click.option("--force", is_flag=True, help="Reset the branch if it exists.")
@pass_app
def import_cmd(
    app: App,
    patches_dir: Path | None,
    lock_file: Path | None,
    model: str | None,
    repo: Path,
    base: str | None,
    branch: str | None,
    force: bool,
) -> None:
    """Apply every patch (no range checks) as commits on a branch of an ATOM work tree, to edit."""
    from pipeline.gitw import GitRepo
    from pipeline.patchq import import_series

    series = _series(app, patches_dir)
    base = base or _locked_atom(app, lock_file, model)
    name, head = import_series(series, GitRepo(repo), base, branch=branch, force=force)
    app.echo(f"{name} {head}")


@command.command(name="export")
@_dir_option
@_lock_options
@_worktree_option("The ATOM work tree holding the patch-queue commits.")
@click.option("--from", "base", help="The base commit (default: the locked ATOM commit).")
@click.option("--to", "tip", default="HEAD", show_default=True, help="The last commit to export.")
@pass_app
def export_cmd(
    app: App,
    patches_dir: Path | None,
    lock_file: Path | None,
    model: str | None,
    repo: Path,
    base: str | None,
    tip: str,
) -> None:
    """Regenerate the patch files and `series` from the commits BASE..TIP (one patch per commit)."""
    from pipeline.gitw import GitRepo
    from pipeline.patchq import export_series

    directory = _patches_dir(app, patches_dir)
    base = base or _locked_atom(app, lock_file, model)
    for path in export_series(GitRepo(repo), base, tip, directory):
        app.echo(str(path))


@command.command(name="new")
@_dir_option
@_lock_options
@_worktree_option("The ATOM work tree holding the commit.")
@click.option("--commit", default="HEAD", show_default=True, help="The commit to turn into a patch.")
@click.option("--from", "base", help="The pinned ATOM commit it sits on (default: the locked one).")
@click.option("--range", "atom_range", help=f"{RANGE} (default: BASE..).")
@click.option("--aiter-after", help=f"{AITER_AFTER}: needed only when aiter contains this commit.")
@click.option("--aiter-requires", help=f"{AITER_REQUIRES}: e.g. 'fused_qknorm_idxrqknorm has kv_cache_v'.")
@click.option("--origin", help="DEP-3 Origin (default: vendor).")
@click.option("--bug", help="DEP-3 Bug (URL).")
@click.option("--forwarded", help="DEP-3 Forwarded (default: no).")
@click.option("--patch-version", type=int, help=f"{VERSION} (default: 1).")
@pass_app
def new_cmd(
    app: App,
    patches_dir: Path | None,
    lock_file: Path | None,
    model: str | None,
    repo: Path,
    commit: str,
    base: str | None,
    atom_range: str | None,
    aiter_after: str | None,
    aiter_requires: str | None,
    origin: str | None,
    bug: str | None,
    forwarded: str | None,
    patch_version: int | None,
) -> None:
    """Append one commit to the series as the next NNNN-slug.patch, with DEP-3 headers."""
    from pipeline.gitw import GitRepo
    from pipeline.patchq import new_patch

    directory = _patches_dir(app, patches_dir)
    base = base or _locked_atom(app, lock_file, model)
    overrides = {
        k: v
        for k, v in (
            (RANGE, atom_range),
            (AITER_AFTER, aiter_after),
            (AITER_REQUIRES, aiter_requires),
            ("Origin", origin),
            ("Bug", bug),
            ("Forwarded", forwarded),
            (VERSION, str(patch_version) if patch_version is not None else None),
        )
        if v is not None
    }
    path = new_patch(GitRepo(repo), commit, base, directory, overrides=overrides)
    app.echo(str(path))


@command.command(name="draft")
@_dir_option
@_lock_options
@_repo_options
@click.option(
    "--atom", "atom_rev", help="Draft for this ATOM commit instead of the locked one (with --aiter)."
)
@click.option("--aiter", "aiter_rev", help="Draft for this aiter commit instead of the locked one.")
@click.option("--dry-run", is_flag=True, help="Print the drafts; write nothing into the series.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def draft_cmd(
    app: App,
    patches_dir: Path | None,
    lock_file: Path | None,
    model: str | None,
    atom_repo: Path | None,
    aiter_repo: Path | None,
    atom_rev: str | None,
    aiter_rev: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Draft the ATOM fix of each breaking call whose fix is mechanical, as patches in the series.

    \b
    A shifted call is rewritten with keyword arguments (each argument to the parameter it
    was written for, as the pin names it); a renamed keyword gets the new name; a new
    required parameter gets `name=PIPELINE_DRAFT_TODO`, which `patch apply` refuses until
    a person writes the value. Each draft is `Status: draft` (DEP-3) with the finding, the
    aiter cause and this command; the check of the drafted tree is printed.
    """
    from datetime import UTC, datetime

    from pipeline.compat import run_check
    from pipeline.patchq.draft import draft_fixes, drafted_commit
    from pipeline.patchq.pq import write_series
    from pipeline.stages import check

    settings = app.settings()
    ctx = app.context()
    directory = _patches_dir(app, patches_dir)
    series = PatchSeries.load(directory) if (directory / "series").is_file() else PatchSeries(directory)
    recipe: Path | None = None
    if (atom_rev is None) != (aiter_rev is None) or (atom_rev and (atom_repo is None or aiter_repo is None)):
        raise UsageError(
            "--atom and --aiter name the commits together, and need --atom-repo and --aiter-repo.",
            hint="Give all four, or neither (the lock's commits: --model M or --lock FILE).",
        )
    if atom_rev is not None and aiter_rev is not None and atom_repo and aiter_repo:
        from pipeline.gitw import GitRepo

        atom, aiter = GitRepo(atom_repo), GitRepo(aiter_repo)
        inputs = check.Inputs(
            model=model or "",
            atom_rev=validate.ref(atom_rev, what="ATOM ref"),
            aiter_rev=validate.ref(aiter_rev, what="aiter ref"),
            atom_repo=atom_repo,
            aiter_repo=aiter_repo,
            reports_dir=Path("."),
        )
        start = atom.rev_parse(atom_rev) or atom_rev
        invocation = f"pipeline patch draft --atom {atom_rev} --aiter {aiter_rev}"
        if model:
            from pipeline.recipes.recipe import find_recipe

            recipe = find_recipe(validate.model(model), Path(settings.paths.recipes_dir))
    else:
        lock = Lock.load(_lock_path(app, lock_file, model))
        atom, aiter = _repos(app, lock, atom_repo, aiter_repo)
        inputs = check.inputs_from_lock(
            ctx,
            lock,
            atom_repo=atom_repo,
            aiter_repo=aiter_repo,
            patches_dir=directory,
            unpatched=False,
            recipe=None,
        )
        recipe, start = inputs.recipe, lock.atom.sha
        invocation = f"pipeline patch draft --model {lock.model}"
    cache = settings.cache_dir / "compat"
    now = datetime.now(UTC).replace(microsecond=0)
    with app.log.stage("patch draft", f"ATOM {inputs.atom_rev[:12]} × aiter {inputs.aiter_rev[:12]}") as rec:
        report = run_check(
            atom, inputs.atom_rev, aiter, inputs.aiter_rev, cache_dir=cache, dated_by=inputs.dated_by
        )
        if recipe is not None:  # only what gates this model (off-path errors are warnings)
            from pipeline.compat.reach import gate_model
            from pipeline.recipes.recipe import load_recipe

            loaded = load_recipe(recipe)
            report = gate_model(report, atom, loaded, cache_dir=cache).report
        numbers = [int(p.name[:4]) for p in series if p.name[:4].isdigit()]
        result = draft_fixes(
            atom, report.atom_sha, aiter, report.aiter_sha, report.findings,
            range_start=start, command=invocation, date=now, first_number=max(numbers, default=0) + 1,
            cache_dir=cache,
        )  # fmt: skip
        drafted = None
        if result.files:
            # dated like its base: the same drafts make the same commit, whose check is then cached
            head = drafted_commit(atom, report.atom_sha, result.files, atom.commit_info(report.atom_sha).date)
            # dated like the tree the findings are about: the same "written when" screens
            dated = inputs.dated_by or report.atom_sha
            drafted = run_check(atom, head, aiter, report.aiter_sha, cache_dir=cache, dated_by=dated)
            if recipe is not None:
                drafted = gate_model(drafted, atom, loaded, cache_dir=cache).report
        rec.figure = f"{len(result.drafts)} draft(s), {len(result.skipped)} not mechanical"
    if not dry_run and result.drafts:
        _write_drafts(directory, series, result.drafts, atom, start, aiter, report.aiter_sha, write_series)
    placeholders = [p for d in result.drafts for p in d.placeholders]
    remaining = drafted.errors if drafted is not None else []
    # errors at the calls no draft was possible for are expected: say whether anything else is left
    skipped = {(x.path, x.line) for x in result.skipped}
    other = [f for f in remaining if (f.path, f.line) not in skipped]
    verdict = f"the check of the drafted tree: {len(remaining)} error(s)" + (
        f", {len(placeholders)} placeholder(s) to fill" if placeholders else ""
    )
    if remaining and not other:
        verdict += " (all at the calls not drafted above)"
    if placeholders and not other:
        verdict += "; clean except for " + ("those and " if remaining else "") + "the placeholders"
    if as_json:
        app.emit_json(
            {
                **result.to_json(),
                "written": not dry_run,
                "drafted_check": None
                if drafted is None
                else {"errors": [f.to_json() for f in remaining], "placeholders": placeholders},
            }
        )
    else:
        for d in result.drafts:
            where = "(dry run) " if dry_run else f"{directory / d.name}: "
            app.echo(
                f"{where}{d.function} at {', '.join(d.sites)}"
                + (f" (aiter {d.cause[:10]})" if d.cause else "")
            )
            for n in d.notes:
                app.echo(f"    review: {n}")
            for p in d.placeholders:
                app.echo(f"    placeholder: {p}")
            if dry_run:
                app.echo(d.text)
        for s in result.skipped:
            app.echo(f"not mechanical: {s.path}:{s.line} {s.function} [{s.kind}]: {s.reason}")
        if drafted is not None:
            app.echo(verdict)
            for f in remaining:
                app.echo(f"    {f.path}:{f.line}: [{f.kind}] {f.message}")
        elif not result.skipped:
            app.echo("nothing to draft: no breaking call")


def _write_drafts(
    directory: Path,
    series: PatchSeries,
    drafts: Any,
    atom: GitRepo,
    atom_sha: str,
    aiter: GitRepo,
    aiter_sha: str,
    write_series: Callable[[Path, list[str]], None],
) -> None:
    """Append the drafts to the series, then prove it: each must parse and apply on top of the series
    (`git apply`, as `patch check` does). All or nothing: on a failure the series is as before."""
    from pipeline.fsutil import atomic_write_text
    from pipeline.patchq import check_series

    directory.mkdir(parents=True, exist_ok=True)
    names = [p.name for p in series]
    series_file = directory / "series"
    before = series_file.read_text(encoding="utf-8") if series_file.is_file() else None
    written: list[Path] = []
    try:
        for d in drafts:
            path = directory / d.name
            if path.exists():
                raise PatchError(f"{path} exists already.", hint="Remove or rename it, then draft again.")
            atomic_write_text(path, d.text)
            written.append(path)
        write_series(directory, names + [d.name for d in drafts])
        checks = check_series(PatchSeries.load(directory), atom, atom_sha, aiter, aiter_sha)
        bad = [c for c in checks if c.patch.name in {d.name for d in drafts} and c.status != "applies"]
        if bad:
            raise PatchError(
                f"draft {bad[0].patch.name} does not apply on top of the series ({bad[0].status}: "
                f"{bad[0].reason}); nothing was written.",
                hint="Draft with the series as it applies (`pipeline patch check`), or report this.",
            )
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        if before is None:
            series_file.unlink(missing_ok=True)
        else:
            atomic_write_text(series_file, before)
        raise
