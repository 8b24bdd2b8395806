"""Recipe waivers: reviewed decisions that a breaking call is not on a model's path.

A waived finding stays in every report, as a warning that carries the reason; it
no longer gates the build. A waiver that matches nothing is reported so that it
is removed once upstream fixes the call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from pipeline.compat.report import CheckReport, Finding


class Waiver(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def function(self) -> str: ...
    @property
    def reason(self) -> str: ...


def _bare(condition: str) -> str:
    words = condition.split()
    return " ".join(words[1:] if words and words[0] in ("if", "elif", "while") else words)


def covers(when: Sequence[str], ways: Sequence[Sequence[str]]) -> bool:
    """Does every way the call's file is reached pass a condition the waiver names? A named
    condition covers itself and any conjunction it starts (`X and Y` holds only where X does)."""
    named = [_bare(w) for w in when]
    return bool(ways) and all(
        any(c == n or c.startswith(n + " and ") for c in map(_bare, way) for n in named) for way in ways
    )


def applies(w: Waiver, f: Finding) -> bool:
    if f.severity != "error" or f.path != w.path or f.function != w.function:
        return False
    when = tuple(getattr(w, "when", ()) or ())  # optional: the conditions it was reviewed for
    return not when or covers(when, f.reach_conditions)


def apply_waivers(report: CheckReport, waivers: Sequence[Waiver]) -> tuple[CheckReport, list[Waiver]]:
    """The report with matching errors turned into waived warnings, and the unused waivers."""
    used: set[int] = set()
    findings = []
    for f in report.findings:
        match = next(
            (i for i, w in enumerate(waivers) if applies(w, f)),
            None,
        )
        if match is None:
            findings.append(f)
            continue
        used.add(match)
        findings.append(
            dataclasses.replace(
                f, severity="warning", message=f"waived by the recipe ({waivers[match].reason}): {f.message}"
            )
        )
    unused = [w for i, w in enumerate(waivers) if i not in used]
    return dataclasses.replace(report, findings=findings), unused
