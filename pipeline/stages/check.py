"""check: gate exactly the tree the image is built from (the patch stage's commit) against aiter.

Static: every ATOM call of an aiter function is bound against aiter's
signature at the pinned commit (pipeline.compat). The pristine pin is checked
too, for the record (what the patch series fixes). A recipe's reviewed waivers
turn matching errors into warnings that stay in every report.

With a recipe, the check gates for that model (pipeline.compat.reach): errors in
calls off the model's code path become warnings carrying the evidence, then the
recipe's reviewed waivers apply. Counts, the same everywhere (`compat.report.Counts`,
one function for the reports, this stage's line and its record): an *error* is an
error-severity finding after that; a *warning* is every other finding (off-path
and waived ones included); *off path* and *waived* say how many errors each turned
into warnings.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.lock import Lock
from pipeline.stages.base import Context, StageData, Upstream

if TYPE_CHECKING:
    from pipeline.compat.report import Counts, Finding
    from pipeline.gitw import GitRepo
    from pipeline.stages.spec import BuildSpec

NAME = "check"
STOPS: tuple[type[Exception], ...] = ()
REPORTS = ("check.txt", "check.json", "check.sarif")  # compat.verdict.REPORT_FILES


class Inputs(StageData):
    model: str
    atom_rev: str  # the tree to gate (the patched commit)
    aiter_rev: str
    lock: Lock | None = None  # the repositories are the lock's mirrors (else atom_repo/aiter_repo)
    atom_repo: Path | None = None
    aiter_repo: Path | None = None
    pristine: str | None = None  # the pinned ATOM commit, checked for the record when it differs
    dated_by: str | None = None  # the commit whose date says "written when" (the pin, for a patched tree)
    baseline_aiter: str | None = None
    recipe: Path | None = None  # gate for its model: its code path (reach), then its reviewed waivers
    waivers: bool = True
    reports_dir: Path  # check.txt/json/sarif (and check-pristine.json) are written here
    show_report: bool = False  # also print the text report when the gate fails (in a run)


class Outputs(StageData):
    atom_sha: str
    aiter_sha: str
    errors: int
    warnings: int
    waived: int
    checked: int
    unchecked: int
    off_path: int = 0
    architecture: str | None = None  # the model's, when its reach was computed
    pristine_errors: int | None = None  # errors of the unpatched pin, when it was checked

    def counts(self) -> Counts:
        from pipeline.compat.report import Counts

        return Counts(self.errors, self.warnings, off_path=self.off_path, waived=self.waived)

    def figure(self) -> str:
        from pipeline.compat import verdict

        return verdict.figure(self.counts(), self.checked, self.unchecked, self.pristine_errors)


def plan(ctx: Context, spec: BuildSpec, up: Upstream) -> Inputs:
    from pipeline.stages import patch as patch_stage

    patched = up.get("patch", patch_stage.Outputs)
    lock = patched.lock
    return Inputs(
        model=spec.model,
        atom_rev=patched.head,
        aiter_rev=lock.aiter.sha,
        lock=lock,
        pristine=lock.atom.sha,
        dated_by=lock.atom.sha if patched.head != lock.atom.sha else None,
        recipe=spec.recipe_path,
        reports_dir=ctx.work_dir,
        show_report=True,
    )


def reads(ctx: Context, inputs: Inputs) -> Iterable[Path]:
    return [inputs.recipe] if inputs.recipe is not None else []


def run(ctx: Context, inputs: Inputs) -> Outputs:
    from pipeline.compat import run_check, verdict
    from pipeline.compat.report import Counts
    from pipeline.fsutil import atomic_write_json, atomic_write_text

    atom, aiter = _repos(ctx, inputs)
    cache = ctx.settings.cache_dir / "compat"
    report = run_check(
        atom,
        inputs.atom_rev,
        aiter,
        inputs.aiter_rev,
        baseline_aiter_rev=inputs.baseline_aiter,
        cache_dir=cache,
        dated_by=inputs.dated_by,
    )
    pristine_errors = None
    if inputs.pristine is not None:
        pristine = report
        if atom.rev_parse(inputs.pristine) != report.atom_sha:
            pristine = run_check(atom, inputs.pristine, aiter, inputs.aiter_rev, cache_dir=cache)
        atomic_write_json(inputs.reports_dir / "check-pristine.json", pristine.to_json())
        pristine_errors = len(pristine.errors)
    raw, reach = report, None
    if inputs.recipe is not None:  # (reach and recipes imported only here: a plain check starts faster)
        from pipeline.compat.reach import gate_model
        from pipeline.recipes.recipe import load_recipe

        gate = gate_model(report, atom, load_recipe(inputs.recipe), cache_dir=cache, waivers=inputs.waivers)
        report, reach = gate.report, gate.reach
        if reach is not None:
            ctx.log.detail(reach.edges_summary())
        for msg in (*gate.warnings, *(n.message for n in gate.notes)):
            ctx.log.warn(msg)
    counts = Counts.of(report, raw)
    texts = {fmt: verdict.render(fmt, report, counts, reach) for fmt in verdict.REPORT_FILES}
    for fmt, name in verdict.REPORT_FILES.items():
        atomic_write_text(inputs.reports_dir / name, texts[fmt])
    # ATOM's files are not in the job's checkout: the annotation links to them
    verdict.annotate(ctx.log, report, lambda f: _source_link(inputs, report.atom_sha, f))
    out = Outputs(
        atom_sha=report.atom_sha,
        aiter_sha=report.aiter_sha,
        errors=counts.errors,
        warnings=counts.warnings,
        waived=counts.waived,
        checked=report.calls_checked,
        unchecked=report.calls_unchecked,
        off_path=counts.off_path,
        architecture=reach.facts.architecture if reach is not None else None,
        pristine_errors=pristine_errors,
    )
    if out.errors:
        raise verdict.incompatible(
            report,
            out.errors,
            patched=bool(inputs.dated_by),
            model=inputs.model,
            shown=texts["text"].removesuffix("\n") if inputs.show_report else None,
        )
    return out


def _source_link(inputs: Inputs, atom_sha: str, finding: Finding) -> str:
    """` (https://github.com/…/blob/<sha>/<path>#L<line>)` for a GitHub ATOM, else ""."""
    import re

    url = inputs.lock.atom.url if inputs.lock is not None else ""
    m = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?/?", url)
    if m is None:
        return ""
    sha = inputs.lock.atom.sha if inputs.lock is not None and inputs.dated_by else atom_sha
    patched = " (the pinned commit; the checked tree adds the patch series)" if inputs.dated_by else ""
    return f" (https://github.com/{m.group(1)}/blob/{sha}/{finding.path}#L{finding.line}{patched})"


def inputs_from_lock(
    ctx: Context,
    lock: Lock,
    *,
    atom_repo: Path | None,
    aiter_repo: Path | None,
    patches_dir: Path | None,
    unpatched: bool,
    recipe: Path | None,
    lock_path: Path | None = None,
) -> Inputs:
    """The check of a lock's commits, once the lock is verified (`stages.verify`): when it records
    applied patches, the patched tree the patch stage makes (`unpatched`: the pin as it is)."""
    import contextlib

    from pipeline.errors import ConfigError
    from pipeline.recipes.recipe import find_recipe
    from pipeline.stages.verify import verify_lock

    # the lock is verified first: a tampered lock is inconsistent (exit 12), not "compatible"
    verified = verify_lock(
        ctx,
        lock,
        lock_path=lock_path,
        lock_given=lock_path is not None,
        patches_dir=patches_dir,
        atom_repo=atom_repo,
        aiter_repo=aiter_repo,
    )
    atom_rev, dated_by = lock.atom.sha, None
    if verified.head != lock.atom.sha and not unpatched:
        atom_rev, dated_by = verified.head, lock.atom.sha
        ctx.log.detail(
            f"checking the patched ATOM tree {atom_rev[:10]} ({len(lock.applied_patches)} patch(es))"
        )
    if recipe is None:
        with contextlib.suppress(ConfigError):  # no recipe for the model: nothing to waive
            recipe = find_recipe(lock.model, Path(ctx.settings.paths.recipes_dir))
    return Inputs(
        model=lock.model,
        atom_rev=atom_rev,
        aiter_rev=lock.aiter.sha,
        lock=lock,
        atom_repo=atom_repo,
        aiter_repo=aiter_repo,
        dated_by=dated_by,
        recipe=recipe,
        reports_dir=Path("."),
    )


def _repos(ctx: Context, inputs: Inputs) -> tuple[GitRepo, GitRepo]:
    """The repositories given, else the mirrors of the lock's sources (where the patched commit lives)."""
    from pipeline.errors import SourceError, UsageError
    from pipeline.gitw import GitRepo

    lock = inputs.lock
    found = []
    for given, url, rev, name in (
        (inputs.atom_repo, lock.atom.url if lock else None, inputs.atom_rev, "ATOM"),
        (inputs.aiter_repo, lock.aiter.url if lock else None, inputs.aiter_rev, "aiter"),
    ):
        if given is not None:
            repo = GitRepo(given)
        elif url is not None:
            from pipeline.sources import open_mirror  # (given repositories need no mirror)

            repo = open_mirror(ctx.settings, url, fetch=False)
        else:
            raise UsageError(f"which {name} repository? Pass --lock or --{name.lower()}-repo.")
        if repo.rev_parse(rev) is None:
            raise SourceError(
                f"the {name} commit {rev} is not in {repo.path}.",
                hint="Run `pipeline pin` again, or point --atom-repo/--aiter-repo at a repository "
                "that has it.",
            )
        found.append(repo)
    return found[0], found[1]
