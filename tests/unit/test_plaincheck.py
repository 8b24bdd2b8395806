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
