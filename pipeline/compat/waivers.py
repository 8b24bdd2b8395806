"""Recipe waivers: reviewed decisions that a breaking call is not on a model's path.

A waived finding stays in every report, as a warning that carries the reason; it
no longer gates the build. A waiver that matches nothing is reported so that it
is removed once upstream fixes the call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from pipeline.compat.report import CheckReport


class Waiver(Protocol):
    @property
    def path(self) -> str: ...
    @property
    def function(self) -> str: ...
    @property
    def reason(self) -> str: ...


def apply_waivers(report: CheckReport, waivers: Sequence[Waiver]) -> tuple[CheckReport, list[Waiver]]:
    """The report with matching errors turned into waived warnings, and the unused waivers."""
    used: set[int] = set()
    findings = []
    for f in report.findings:
        match = next(
            (
                i
                for i, w in enumerate(waivers)
                if f.severity == "error" and f.path == w.path and f.function == w.function
            ),
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
