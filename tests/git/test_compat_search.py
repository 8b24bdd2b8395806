"""search_compatible on fixture repositories: newest compatible aiter, first breaking, none."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.compat import search_compatible
from pipeline.compat.search import pin_fits
from pipeline.gitw import GitRepo
from pipeline.patchq import PatchSeries
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos
from tests.fixtures.patch_repos import patch_text, write_series


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("compat-search"))


def test_newest_compatible_and_first_breaking(fx: CompatRepos) -> None:
    r = search_compatible(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A4"])
    assert r.newest_compatible is not None and r.newest_compatible.sha == fx.a["A1c"]
    assert r.first_breaking is not None and r.first_breaking.sha == fx.a["A2"]
    # Only commits touching the files the check reads: A4 (head), A3, A2, A1c; never the README commit.
    assert r.commits_examined == 4
    assert not pin_fits(r.report_at_head)
    assert r.report_at_newest is not None and pin_fits(r.report_at_newest)
    # T1's rmsnorm call fails to bind at every aiter: an error no pin fixes, named, not walked for.
    (bug,) = r.report_at_newest.errors
    assert (bug.function, bug.preexisting) == ("aiter.rmsnorm", True)
    assert "`aiter.rmsnorm` (atom/models/styles.py:" in r.explanation
    assert "each needs a patch of ATOM or a waiver with a reason" in r.explanation


def test_a_call_no_aiter_binds_is_not_searched_for(fx: CompatRepos) -> None:
    # At A1c T1's one error is its rmsnorm call, which fails to bind under every signature rmsnorm has
    # had: no older aiter fixes it, so the head is the answer and the walk stops there, naming it.
    r = search_compatible(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A1c"])
    assert r.newest_compatible is not None and r.newest_compatible.sha == fx.a["A1c"]
    assert r.commits_examined == 1 and r.first_breaking is None
    assert [(f.function, f.preexisting) for f in r.report_at_head.errors] == [("aiter.rmsnorm", True)]
    assert "no aiter pin fixes them (the search did not walk history for them)" in r.explanation


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


def test_search_runs_on_the_patched_tree(fx: CompatRepos, tmp_path: Path) -> None:
    # A patch adapting dense.py to the split kv cache, needed when aiter's fused_qk has kv_cache_v.
    work = tmp_path / "atom-work"
    subprocess.run(["git", "clone", "-q", str(fx.atom), str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "checkout", "-q", fx.t["T1"]], check=True)
    dense = work / "atom/models/dense.py"
    text = dense.read_text()
    text = text.replace("            None,\n            None,\n", "            None,\n" * 3, 1)
    assert text.count("None,\n") == 3
    text = text.replace("self.kv_cache, self.index_cache", "self.kv_cache, None, self.index_cache")
    text = text.replace("1e-6, None, None, 0, q)", "1e-6, None, None, None, 0, q)")
    dense.write_text(text)
    diff = subprocess.run(
        ["git", "-C", str(work), "diff", "--", "atom/models/dense.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    series = write_series(
        tmp_path / "series",
        {
            "0001-dense-split-kv-cache.patch": patch_text(
                atom_range=f"{fx.t['T1'][:12]}..",
                diff=diff,
                extra="X-Aiter-Requires: fused_qk has kv_cache_v\n",
                subject="dense: split kv cache",
            )
        },
    )
    atom, aiter = GitRepo(fx.atom), GitRepo(fx.aiter)
    plain = search_compatible(atom, fx.t["T1"], aiter, fx.a["A2"])
    assert plain.newest_compatible is not None and plain.newest_compatible.sha == fx.a["A1c"]
    patched = search_compatible(atom, fx.t["T1"], aiter, fx.a["A2"], patches=PatchSeries.load(series))
    assert patched.newest_compatible is not None and patched.newest_compatible.sha == fx.a["A2"]
    assert pin_fits(patched.report_at_head) and patched.report_at_head.atom_sha != fx.t["T1"]
    # At A3 the patch still applies, but gemm's removed `scale` breaks other calls: A2 stays the answer.
    later = search_compatible(atom, fx.t["T1"], aiter, fx.a["A3"], patches=PatchSeries.load(series))
    assert later.newest_compatible is not None and later.newest_compatible.sha == fx.a["A2"]
    assert later.first_breaking is not None and later.first_breaking.sha == fx.a["A3"]


# -- commits passed unexamined (search._Unchanged) -----------------------------------------------


def _with_later_noise(root: Path, n: int) -> tuple[CompatRepos, str]:
    """The fixture with n later aiter commits that touch only `rms_norm`'s module (a file the check
    reads, which none of the breaking calls resolves through)."""
    from tests.fixtures.gitfixture import commit_all, write_files

    fx = build_compat_repos(root)
    head = fx.a["A4"]
    for i in range(n):
        write_files(
            fx.aiter, {"aiter/ops/norm.py": f"def rms_norm(x, w, eps: float = 1e-6):\n    return x  # {i}\n"}
        )
        head = commit_all(fx.aiter, f"norm: tidy {i}", f"2026-03-{i + 1:02d}T10:00:00+00:00")
    return fx, head


def test_commits_that_cannot_change_the_breaks_are_passed(tmp_path: Path) -> None:
    fx, head = _with_later_noise(tmp_path / "fx", 20)
    r = search_compatible(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), head)
    # the same answer as without the noise, and the 20 commits that only touch norm.py are not examined
    assert r.newest_compatible is not None and r.newest_compatible.sha == fx.a["A1c"]
    assert r.first_breaking is not None and r.first_breaking.sha == fx.a["A2"]
    assert r.commits_examined <= 5


def test_commits_that_only_add_modules_beside_those_read_are_passed(tmp_path: Path) -> None:
    # A new file in a package with its own __init__.py changes no module a resolution read, nor
    # whether one exists: the resolutions through aiter/__init__.py and aiter/ops still hold.
    from tests.fixtures.gitfixture import commit_all, write_files

    fx = build_compat_repos(tmp_path / "fx")
    head = fx.a["A4"]
    for i in range(20):  # (each also touches norm.py, a module the check reads: a candidate commit)
        norm = f"def rms_norm(x, w, eps: float = 1e-6):\n    return x  # {i}\n"
        extra = f"def extra_{i}(x):\n    return x\n"
        write_files(fx.aiter, {f"aiter/ops/extra_{i}.py": extra, "aiter/ops/norm.py": norm})
        head = commit_all(fx.aiter, f"ops: add extra_{i}", f"2026-03-{i + 1:02d}T10:00:00+00:00")
    r = search_compatible(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), head)
    assert r.newest_compatible is not None and r.newest_compatible.sha == fx.a["A1c"]
    assert r.first_breaking is not None and r.first_breaking.sha == fx.a["A2"]
    assert r.commits_examined <= 5


def test_the_commit_lacking_a_called_function_is_exact_among_those_passed(tmp_path: Path) -> None:
    # T3 calls new_fn (added in A3): going back, A2 is the first commit that lacks it. Between the
    # head and A2 the walk examines only by the breaking calls; the commit is found by bisection.
    fx, head = _with_later_noise(tmp_path / "fx", 20)
    r = search_compatible(GitRepo(fx.atom), fx.t["T3"], GitRepo(fx.aiter), head)
    assert r.newest_compatible is None
    a2 = GitRepo(fx.aiter).commit_info(fx.a["A2"])
    assert f"until {a2.short} " in r.explanation and "`aiter.ops.fused.new_fn`" in r.explanation
    assert r.commits_examined <= 6


@pytest.mark.parametrize("every", [2, 5])
def test_periodic_full_resolutions_end_the_walk_at_the_same_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int
) -> None:
    # With a full resolution every few commits (the walk's periodic scan, not only its last one),
    # the commit named is the same, and the walk still examines few commits.
    from pipeline.compat import search as search_mod

    monkeypatch.setattr(search_mod, "SCAN_EVERY", every)
    fx, head = _with_later_noise(tmp_path / "fx", 20)
    r = search_compatible(GitRepo(fx.atom), fx.t["T3"], GitRepo(fx.aiter), head)
    a2 = GitRepo(fx.aiter).commit_info(fx.a["A2"])
    assert r.newest_compatible is None and f"until {a2.short} " in r.explanation
    assert r.commits_examined <= 6
