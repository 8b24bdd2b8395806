"""The checker's worker processes, forced on the small fixture repositories: the parallel ATOM scan
gives exactly the serial answers, and no worker outlives the run."""

from __future__ import annotations

import multiprocessing

import pytest

from pipeline.compat import engine, run_check
from pipeline.gitw import GitRepo
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("compat-workers"))


def test_the_parallel_scan_gives_the_serial_report(fx: CompatRepos, monkeypatch: pytest.MonkeyPatch) -> None:
    serial = run_check(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A4"])
    monkeypatch.setattr(engine, "PARALLEL_MIN_FILES", 1)
    parallel = run_check(GitRepo(fx.atom), fx.t["T1"], GitRepo(fx.aiter), fx.a["A4"])
    assert parallel.to_json() | {"seconds": None} == serial.to_json() | {"seconds": None}
    assert not serial.ok and serial.errors
    assert multiprocessing.active_children() == []
