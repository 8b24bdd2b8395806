"""search_compatible on fixture repositories: newest compatible aiter, first breaking, none."""

from __future__ import annotations

import pytest

from pipeline.compat import search_compatible
from pipeline.gitw import GitRepo
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("compat-search"))


def test_newest_compatible_and_first_breaking(fx: CompatRepos) -> None:
    r = search_compatible(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A4"])
    assert r.newest_compatible is not None and r.newest_compatible.sha == fx.a["A1c"]
    assert r.first_breaking is not None and r.first_breaking.sha == fx.a["A2"]
    # Only commits touching the files the check reads: A4 (head), A3, A2, A1c; never the README commit.
    assert r.commits_examined == 4
    assert not r.report_at_head.ok
    assert r.report_at_newest is not None and r.report_at_newest.ok


def test_compatible_head_is_the_answer(fx: CompatRepos) -> None:
    r = search_compatible(GitRepo(fx.atom), fx.t["T2"], GitRepo(fx.aiter), fx.a["A4"])
    assert r.newest_compatible is not None and r.newest_compatible.sha == fx.a["A4"]
    assert r.first_breaking is None and r.commits_examined == 1


def test_says_plainly_when_no_aiter_fits_without_patches(fx: CompatRepos) -> None:
    # T3 calls legacy_fn (removed in A2) and new_fn (added in A3).
    r = search_compatible(GitRepo(fx.atom), fx.t["T3"], GitRepo(fx.aiter), fx.a["A4"])
    assert r.newest_compatible is None
    assert "no aiter commit up to" in r.explanation and "without patches" in r.explanation
    assert "`aiter.ops.fused.new_fn`" in r.explanation
    assert {"aiter.ops.fused.new_fn", "aiter.ops.fused.legacy_fn"} <= {f.function for f in r.blocking}


def test_search_from_an_older_head(fx: CompatRepos) -> None:
    r = search_compatible(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A3"])
    assert r.newest_compatible is not None and r.newest_compatible.sha == fx.a["A1c"]
    assert r.first_breaking is not None and r.first_breaking.sha == fx.a["A2"]
