"""The one-shot forked child a night's re-scans run in (`pipeline.compat.workers`): its result comes
back whole, a failed child leaves the work to the checker, and none outlives the run."""

from __future__ import annotations

import os
import time

import pytest

from pipeline.compat import calls, workers
from pipeline.compat.workers import Workers, _Child

OLD = b"import aiter\n\n\ndef f(x):\n    return aiter.gemm(x)\n\n\ndef g(x):\n    return x\n"
NEW = OLD.replace(b"return x\n", b"return aiter.gemm(x, x)\n")


def _jobs() -> list[workers.Rescan]:
    before = calls.scan_file(OLD, "atom/m.py")
    return [(7, "atom/m.py", NEW, before)]


def test_the_childs_rescans_are_the_checkers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "RESCAN_MIN_BYTES", 0)
    w = Workers()
    got = w.rescan(_jobs())
    assert got is not None
    assert list(got) == [(7, calls.scan_file_since(NEW, "atom/m.py", _jobs()[0][3]))]
    assert not w._children


def test_too_little_to_gain_is_left_to_the_checker() -> None:
    assert Workers().rescan(_jobs()) is None  # (a few hundred bytes: no child)


def _fails(_: object) -> object:
    raise RuntimeError("a bug in the child")


def test_a_failed_child_gives_none_and_says_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    child = _Child.start(_fails, None)
    assert child is not None
    assert child.result() is None
    assert capfd.readouterr() == ("", "")  # (no traceback from the child)


def test_when_the_child_fails_the_checker_rescans_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "RESCAN_MIN_BYTES", 0)
    monkeypatch.setattr(_Child, "result", lambda self: (self.cancel(), None)[1])
    got = Workers().rescan(_jobs())
    assert got is not None
    assert [k for k, _ in got] == [7]


def _sleeps(_: object) -> object:
    time.sleep(60)
    return None


def test_close_kills_and_reaps_a_child_still_at_work() -> None:
    w = Workers()
    child = _Child.start(_sleeps, None)
    assert child is not None
    w._children.append(child)
    w.close()
    assert not w._children
    with pytest.raises(ChildProcessError):  # reaped: no zombie left
        os.waitpid(child.pid, os.WNOHANG)


def test_no_child_is_forked_while_another_thread_runs() -> None:
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert _Child.start(_sleeps, None) is None  # (the work is done where it is asked for)
    finally:
        stop.set()
        t.join()


def test_a_childs_summaries_are_taken_by_the_cache_and_a_failed_one_leaves_them_to_it(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    from pipeline.compat.aiterapi import summarize_module
    from pipeline.compat.pysource import SummaryCache
    from pipeline.gitw import GitRepo
    from tests.fixtures.gitfixture import commit_all, git, init_repo, write_files

    repo = init_repo(Path(str(tmp_path)) / "aiter")
    text = b"def rms_norm(x, w, eps: float = 1e-6):\n    return x\n"
    write_files(repo, {"aiter/ops/norm.py": text.decode()})
    commit_all(repo, "A1", "2026-01-01T10:00:00+00:00")
    blob = git(repo, "rev-parse", "HEAD:aiter/ops/norm.py")
    todo = [("aiter/ops/norm.py", blob)]
    want = summarize_module(text, "aiter/ops/norm.py", "aiter.ops.norm")

    def summaries() -> dict[str, object]:
        cache = SummaryCache.open("aiter", None)
        w = Workers()
        assert w.summaries(cache, GitRepo(repo), todo)
        assert f"{blob}:aiter/ops/norm.py" in cache.pending
        made: list[str] = []
        got = cache.get_many(
            GitRepo(repo), todo, lambda b, p: made.append(p) or summarize_module(b, p, "aiter.ops.norm")
        )
        w.close()
        return {"got": got["aiter/ops/norm.py"], "made here": made}

    assert summaries() == {"got": want, "made here": []}
    monkeypatch.setattr(workers, "_summarize_blob", _fails)  # (the child inherits it: fails)
    assert summaries() == {"got": want, "made here": ["aiter/ops/norm.py"]}


def test_the_checker_rescans_the_jobs_the_child_has_not_taken(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs wait in a pipe, biggest first: asked for the results while the child is still on
    its first, the checker takes the others itself; every job is done once, as a direct re-scan."""
    from pathlib import Path

    parent = os.getpid()
    where = Path(str(tmp_path)) / "who"
    since = calls.scan_file_since

    def slow_in_child(data: bytes, path: str, before: object) -> object:
        with where.open("a") as f:
            f.write(f"{os.getpid()} {path}\n")
        if os.getpid() != parent:
            time.sleep(1.0)  # (the checker asks meanwhile)
        return since(data, path, before)  # type: ignore[arg-type]

    before = calls.scan_file(OLD, "atom/m.py")
    jobs: list[workers.Rescan] = [
        (0, "atom/m.py", NEW, before),
        (1, "atom/m.py", NEW + b"\n\ndef h(x):\n    return aiter.gemm(x)\n" * 20, before),  # (biggest)
        (2, "atom/m.py", NEW + b"\n", before),
    ]
    monkeypatch.setattr(workers, "RESCAN_MIN_BYTES", 0)
    monkeypatch.setattr(workers, "scan_file_since", slow_in_child)
    w = Workers()
    got = w.rescan(jobs)
    assert got is not None
    time.sleep(0.3)  # (the child has taken the first job)
    results = dict(got)
    who = [line.split() for line in where.read_text().splitlines()]
    assert sorted(results) == [0, 1, 2]
    assert results == {k: since(data, path, b) for k, path, data, b in jobs}
    assert len(who) == 3 and sum(int(pid) == parent for pid, _ in who) == 2
    assert not w._children
