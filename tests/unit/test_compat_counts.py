"""`Counts`: what an error, a warning, an off-path and a waived finding are, defined once."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.compat.report import CheckReport, Counts, Finding


def _finding(line: int, severity: str = "error", reach: str | None = None) -> Finding:
    return Finding("atom/m.py", line, 1, "aiter.f", severity, "positional-shift", "shifted", reach=reach)


def _report(*findings: Finding) -> CheckReport:
    return CheckReport(list(findings), 4, 0, [], "a" * 40, "b" * 40)


def test_each_excused_error_is_counted_once_by_what_excused_it() -> None:
    raw = _report(_finding(1), _finding(2), _finding(3), _finding(4), _finding(5, "warning"))
    gated = _report(
        _finding(1, reach="on-path"),  # still gates
        dataclasses.replace(_finding(2, "warning", "on-path"), message="waived by the recipe (r): shifted"),
        dataclasses.replace(_finding(3, "warning", "on-path"), message="waived by the recipe (r): shifted"),
        _finding(4, "warning", "off-path"),
        _finding(5, "warning", "off-path"),  # a warning already: not excused by the gate
    )
    counts = Counts.of(gated, raw)
    assert (counts.errors, counts.warnings, counts.off_path, counts.waived) == (1, 4, 1, 2)
    assert counts.summary() == "1 error(s), 4 warning(s) (1 off the model's path, 2 waived by the recipe)"
    assert counts.summary() + ";" in gated.to_text(counts)
    assert gated.to_json(counts)["counts"] == {
        "calls_checked": 4,
        "calls_unchecked": 0,
        "errors": 1,
        "warnings": 4,
        "off_path": 1,
        "waived": 2,
        "unparseable_files": 0,
        "notes": 0,
    }


def test_without_a_gate_nothing_is_excused() -> None:
    report = _report(_finding(1), _finding(2, "warning"))
    assert Counts.of(report) == Counts(errors=1, warnings=1)
    assert Counts.of(report).summary() == "1 error(s), 1 warning(s)"


def test_a_gated_report_that_lost_findings_is_refused() -> None:
    with pytest.raises(ValueError, match="findings"):
        Counts.of(_report(_finding(1)), _report(_finding(1), _finding(2)))
