"""The checker's worker processes, forced on the small fixture repositories: the parallel ATOM scan
and the aiter summaries made ahead of a search's resolution give exactly the serial answers, and
no worker outlives the run."""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
from pathlib import Path

import pytest

from pipeline.compat import checker, pysource, run_check, search_compatible, workers
from pipeline.compat.aiterapi import module_from_path, summarize_module
from pipeline.compat.search import SearchResult
from pipeline.gitw import GitRepo
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("compat-workers"))


def _search(fx: CompatRepos) -> SearchResult:
    return search_compatible(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A4"])


def _outcome(r: SearchResult) -> tuple[object, ...]:
    return (
        r.newest_compatible, r.first_breaking, r.commits_examined, r.explanation,
        [f.to_json() for f in r.blocking], r.report_at_head.to_json() | {"seconds": None},
    )  # fmt: skip


def test_the_parallel_scan_gives_the_serial_report(fx: CompatRepos, monkeypatch: pytest.MonkeyPatch) -> None:
    serial = run_check(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A4"])
    monkeypatch.setattr(checker, "PARALLEL_MIN_FILES", 1)
    parallel = run_check(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A4"])
    assert parallel.to_json() | {"seconds": None} == serial.to_json() | {"seconds": None}
    assert not serial.ok and serial.errors
    assert multiprocessing.active_children() == []


def test_summaries_made_ahead_give_the_same_search(fx: CompatRepos, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _search(fx)
    monkeypatch.setattr(workers.Workers, "MIN", 1)
    opened: list[pysource.SummaryCache] = []
    open_cache = pysource.SummaryCache.open

    def keep(kind: str, cache_dir: Path | None) -> pysource.SummaryCache:
        opened.append(open_cache(kind, cache_dir))
        return opened[-1]

    monkeypatch.setattr(pysource.SummaryCache, "open", keep)
    # The checker never waits for a worker (on these tiny repositories it would always be first):
    # here it does, so that the workers' summaries are the ones used.
    monkeypatch.setattr(multiprocessing.pool.ApplyResult, "ready", lambda self: self.wait() or True)
    ahead = _search(fx)
    assert _outcome(ahead) == _outcome(alone)
    assert alone.newest_compatible is not None and alone.newest_compatible.sha == fx.a["A1c"]
    made = [(c, key) for c in opened for key in c.from_workers]
    assert made  # some summaries did come from the workers, and they are the ones made here
    aiter = GitRepo(fx.aiter)
    for c, key in made:
        sha, _, path = key.partition(":")
        assert c.data[key] == summarize_module(aiter.cat_blobs([sha])[sha], path, module_from_path(path))
    assert multiprocessing.active_children() == []


def test_a_worker_that_cannot_read_a_blob_leaves_it_to_the_checker(fx: CompatRepos) -> None:
    git_dir = str(GitRepo(fx.aiter).repo.git_dir)
    assert workers._summarize_blob(git_dir, "0" * 40, "aiter/ops/fused.py", "aiter.ops.fused") is None
    sha = GitRepo(fx.aiter).blob_shas(fx.a["A4"], prefix="aiter", suffix=".py")["aiter/ops/fused.py"]
    got = workers._summarize_blob(git_dir, sha, "aiter/ops/fused.py", "aiter.ops.fused")  # (read again)
    assert got is not None and got.module == "aiter.ops.fused" and got.events
