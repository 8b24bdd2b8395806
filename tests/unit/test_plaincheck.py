"""What the lean plain check (pipeline/plaincheck.py) vouches for about the settings and the CLI."""

from __future__ import annotations

from pathlib import Path

from pipeline import plaincheck
from pipeline.config import load_settings, unknown_env


def test_the_quiet_variables_are_taken_silently_whatever_they_hold(tmp_path: Path) -> None:
    # any value: no ConfigError, no warning, and nothing else a plain check reads changes
    odd = "not a bool, not an int; gfx?"
    env = {name: odd for name in plaincheck.QUIET_ENV}
    assert unknown_env(env) == []
    flags = {"atom_ref": "a", "aiter_ref": "b", "atom_repo": "c", "aiter_repo": "d"}
    s = load_settings(env=env, cwd=tmp_path, overrides=flags)
    assert s.paths.cache_dir == odd
    assert {k: getattr(s.sources, k) for k in flags} == flags


def test_the_stage_figure_is_the_stage_records_whatever_counts_it_is_given() -> None:
    # the CLI's stage line comes from the stage's record (no notes, no unparseable files); the lean
    # path has the report's full counts: one figure for both
    from pipeline.compat import verdict
    from pipeline.compat.report import Counts
    from pipeline.stages.check import Outputs

    counts = Counts(0, 3, off_path=1, waived=1, unparseable=2, notes=4)
    recorded = Outputs(atom_sha="a" * 40, aiter_sha="b" * 40, errors=0, warnings=3, waived=1, checked=9,
                       unchecked=2, off_path=1)  # fmt: skip
    assert verdict.figure(counts, 9, 2) == recorded.figure()
    assert "note" not in recorded.figure() and "2 unchecked" in recorded.figure()
