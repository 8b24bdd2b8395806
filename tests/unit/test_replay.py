"""Which `pipeline check` invocations may be replayed, and how the stage line gets its own time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline import replay

PLAIN = ["check", "--atom", "a", "--aiter", "b", "--atom-repo", "/r/atom", "--aiter-repo", "/r/aiter"]


def test_the_plain_form_is_parsed() -> None:
    assert replay.parse([*PLAIN, "--format=sarif", "--baseline-aiter", "c"]) == {
        "atom": "a", "aiter": "b", "atom_repo": "/r/atom", "aiter_repo": "/r/aiter",
        "format": "sarif", "baseline": "c",
    }  # fmt: skip


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--atom", "a", "--aiter", "b", "--atom-repo", "/r/atom"],  # a repo from the settings
        [*PLAIN, "--lock", "x.lock"],
        [*PLAIN, "--model", "M"],
        [*PLAIN, "-o", "out.txt"],
        [*PLAIN, "--no-waivers"],
        [*PLAIN, "--format", "xml"],
        [*PLAIN, "--atom", "again"],
        ["check", "--atom", "--aiter", "b", "--atom-repo", "/r/atom", "--aiter-repo", "/r/aiter"],
        ["-v", *PLAIN],
        ["pin", *PLAIN[1:]],
        [*PLAIN, "--format"],
    ],
)
def test_anything_else_runs_in_full(argv: list[str]) -> None:
    assert replay.parse(argv) is None


def test_the_cache_dir_follows_the_settings() -> None:
    assert replay.cache_dir({"PIPELINE_CACHE_DIR": "/c"}, b'[paths]\ncache_dir = "/x"\n') == "/c"
    assert replay.cache_dir({}, b'[paths]\ncache_dir = "/x"\n') is None  # the full CLI reads the file
    assert replay.cache_dir({"XDG_CACHE_HOME": "/xdg"}, None) == "/xdg/atom-image-pipeline"


def test_the_default_cache_dir_is_the_one_the_settings_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # replay keeps platformdirs' rule (importing it would cost the fast path its margin): the same answer
    import os

    import platformdirs

    for xdg in ("/xdg", ""):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert replay.cache_dir(os.environ, None) == platformdirs.user_cache_dir("atom-image-pipeline")


def test_the_stage_line_gets_the_replay_time() -> None:
    err = "::group::check\n::endgroup::\n✕ check (61.3s) — ATOM x is not compatible\nerror: y (1.5s)\n"
    assert replay._with_time(err, 0.04) == (
        "::group::check\n::endgroup::\n✕ check (0.0s) — ATOM x is not compatible\nerror: y (1.5s)\n"
    )
    assert replay._with_time("✓ check (2.0s) — 3 calls bind\n", 0.12) == "✓ check (0.1s) — 3 calls bind\n"
    assert replay._with_time("error: no stage line\n", 0.1) is None


def test_records_are_kept_newest_first_per_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setattr(replay, "KEPT_PER_DIR", 3)
    d = tmp_path / "ab"
    for i in range(5):
        replay._store(str(d / f"ab{i}"), {"schema": replay.SCHEMA, "code": 0, "out": "x", "err": ""})
        os.utime(d / f"ab{i}", (1000 + i, 1000 + i))
    replay._store(str(d / "ab5"), {"schema": replay.SCHEMA, "code": 0, "out": "x", "err": ""})
    assert sorted(p.name for p in d.iterdir()) == ["ab3", "ab4", "ab5"]
