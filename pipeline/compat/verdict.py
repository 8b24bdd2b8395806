"""What a check prints, from its report: the reports, the stage line's figure, the verdict.

One source for every caller that prints a check: the check stage (`pipeline.stages.check`,
which `pipeline check`, `build` and `rebuild` run) and the plain `pipeline check` answered
without the CLI framework (`pipeline.plaincheck`). No pydantic, no click: the latter imports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.errors import IncompatibleError

if TYPE_CHECKING:
    from pipeline.compat.reach import Reach
    from pipeline.compat.report import CheckReport, Counts, Finding
    from pipeline.log import Logger

# `--format` -> the report file the check stage writes (all three, whatever is printed)
REPORT_FILES: dict[str, str] = {"text": "check.txt", "json": "check.json", "sarif": "check.sarif"}


def title(atom_rev: str, aiter_rev: str) -> str:
    """The check stage's title (the log file, `-v`, a GitHub Actions group)."""
    return f"ATOM {atom_rev[:12]} × aiter {aiter_rev[:12]}"


def figure(counts: Counts, checked: int, unchecked: int, pristine_errors: int | None = None) -> str:
    """The stage line's figure of a compatible check: `0 error(s), ...; 812 calls bind (...)`, of
    the counts a stage's record keeps (`stages.check.Outputs`: no notes)."""
    from pipeline.compat.report import Counts

    kept = Counts(counts.errors, counts.warnings, off_path=counts.off_path, waived=counts.waived)
    gated = kept.errors + kept.waived + kept.off_path  # the check's errors before the gate
    fixed = ""
    if pristine_errors is not None and pristine_errors > gated:
        fixed = f", {pristine_errors - gated} fixed by patches"
    return f"{kept.summary()}; {checked} calls bind ({unchecked} unchecked{fixed})"


def render(fmt: str, report: CheckReport, counts: Counts, reach: Reach | None = None) -> str:
    """The report in `fmt` (text, json, sarif) as its file holds it (REPORT_FILES)."""
    if fmt == "text":
        text = report.to_text(counts) + (f"\nreach: {reach.edges_summary()}" if reach is not None else "")
        return text + "\n"
    if fmt == "json":
        data = report.to_json(counts)
        if reach is not None:
            data["reach"] = reach.to_json()  # the model, its module, the edges followed and the rules
        return json.dumps(data, indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(report.to_sarif(), indent=2) + "\n"
    raise ValueError(f"no report format {fmt!r}")


def annotate(log: Logger, report: CheckReport, link: Callable[[Finding], str] | None = None) -> None:
    """On GitHub Actions, an `::error::` annotation per error (`link`: where its source is)."""
    if log.github:
        for f in report.errors:
            log.error(f"{f.path}:{f.line}:{f.col}: {f.message}" + (link(f) if link is not None else ""))


def incompatible(
    report: CheckReport, errors: int, *, patched: bool, model: str, shown: str | None = None
) -> IncompatibleError:
    """The verdict of a check with `errors` errors (`shown`: the text report, printed with it)."""
    with_patches = " (with the patch series)" if patched else ""
    pin_model = f" --model {model or 'MODEL'}"  # pin needs a model (its recipe), always
    return IncompatibleError(
        f"ATOM {report.atom_sha[:10]}{with_patches} is not compatible with aiter {report.aiter_sha[:10]}: "
        f"{errors} breaking call(s); nothing was built." + (f"\n{shown}" if shown is not None else ""),
        hint="Add or fix a patch under patches/atom (`pipeline patch new`), or pin an aiter that "
        f"this ATOM supports (`pipeline pin{pin_model} --auto`).",
    )


def staged(log: Logger, atom_rev: str, aiter_rev: str, work: Callable[[], str]) -> IncompatibleError | None:
    """Run `work` (it returns the figure) as the check stage: `✓ check (0.4s) — figure`, or
    `✕ check (0.4s) — <the verdict's first line>` and the IncompatibleError returned (the
    caller prints the report before it). Any other exception fails the stage and propagates."""
    with log.stage("check", title(atom_rev, aiter_rev)) as rec:
        try:
            rec.figure = work()
        except IncompatibleError as e:
            rec.status, rec.figure = "failed", e.message.splitlines()[0]
            return e
    return None
