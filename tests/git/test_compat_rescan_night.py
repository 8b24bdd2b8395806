"""A night's changed ATOM file is scanned from the previous night's cached scan, only its changed
functions parsed, and the check reports (and caches) what a cold check does (issue 28 §7)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pipeline.compat import calls, run_check
from pipeline.compat.pysource import SummaryCache
from pipeline.gitw import GitRepo
from tests.fixtures.compat_repos import build_compat_repos
from tests.fixtures.gitfixture import commit_all, git, write_files

MODEL = "atom/models/big.py"
FRESH = "atom/models/fresh.py"
FRESH_TEXT = "from aiter.ops.norm import rms_norm\n\n\ndef f(x, w):\n    return rms_norm(x, w, bias=None)\n"

NIGHT1 = """\
import aiter
from aiter.ops.norm import rms_norm
from aiter.ops.cache import cache_op


class Model:
    def __init__(self):
        self.norm = rms_norm

    def prefill(self, x, w):
        y = self.norm(x, w)
        return aiter.gemm(y, w)

    def cache(self, k, v, slots):
        cache_op(k, v, slots, "nhd")

    def decode(self, x, w):
        return rms_norm(x, w, 1e-5)


def helper(x, w):
    return rms_norm(x, w)
"""

# The night's commits: decode calls rms_norm wrongly now, a function is added above the class.
NIGHT2 = NIGHT1.replace(
    "        return rms_norm(x, w, 1e-5)\n", "        return rms_norm(x, w, eps=1e-5, bias=None)\n"
).replace("\n\nclass Model:", "\n\ndef early(x):\n    return aiter.gemm(x)\n\n\nclass Model:")


def _said(r: Any) -> dict[str, Any]:
    out = r.to_json()
    out.pop("seconds", None)
    return out


def test_the_next_night_scans_only_the_changed_functions_and_reports_as_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repos = build_compat_repos(tmp_path / "fx")
    atom, aiter = GitRepo(repos.atom), GitRepo(repos.aiter)
    git(repos.atom, "checkout", "-q", repos.t["T3"])
    write_files(repos.atom, {MODEL: NIGHT1})
    first = commit_all(repos.atom, "a model", "2026-05-01T10:00:00+00:00")
    write_files(repos.atom, {MODEL: NIGHT2})
    second = commit_all(repos.atom, "decode changed", "2026-05-02T10:00:00+00:00")
    cache = tmp_path / "cache"
    run_check(atom, first, aiter, repos.a["A4"], cache_dir=cache)

    scanned: list[str] = []
    real = calls._Scanner._scan_function_body

    def spy(self: calls._Scanner, fn: Any, outer: Any, cls_env: Any) -> None:
        if self.path == MODEL:
            scanned.append(getattr(fn, "name", "<lambda>"))
        real(self, fn, outer, cls_env)

    monkeypatch.setattr(calls._Scanner, "_scan_function_body", spy)
    got = run_check(atom, second, aiter, repos.a["A4"], cache_dir=cache)
    assert sorted(scanned) == ["__init__", "decode", "early"]  # (__init__ sets self.norm: every time)
    monkeypatch.undo()
    cold = run_check(atom, second, aiter, repos.a["A4"], cache_dir=tmp_path / "cold")
    assert _said(got) == _said(cold)
    # The unchanged method's finding, at its line of the new text (4 lines down): taken, not re-scanned.
    line = NIGHT2.split("\n").index('        cache_op(k, v, slots, "nhd")') + 1
    assert line == NIGHT1.split("\n").index('        cache_op(k, v, slots, "nhd")') + 1 + 4
    assert [f.line for f in got.findings if f.path == MODEL and "cache_op" in f.message] == [line]
    # What the night cached for the file is what a cold check caches, field by field.
    blob = git(repos.atom, "rev-parse", f"{second}:{MODEL}")
    night = SummaryCache.open("atom", cache).data[f"{blob}:{MODEL}"]
    fresh = SummaryCache.open("atom", tmp_path / "cold").data[f"{blob}:{MODEL}"]
    for f in dataclasses.fields(night):
        assert getattr(night, f.name) == getattr(fresh, f.name), f.name


def test_a_big_nights_rescans_run_in_a_child_and_report_and_cache_as_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big enough (here: any size), the night's re-scans run in a forked child while the checker
    binds the unchanged files' calls: the report and the cache are a cold check's all the same."""
    import os

    from pipeline.compat import workers

    repos = build_compat_repos(tmp_path / "fx")
    atom, aiter = GitRepo(repos.atom), GitRepo(repos.aiter)
    git(repos.atom, "checkout", "-q", repos.t["T3"])
    write_files(repos.atom, {MODEL: NIGHT1})
    first = commit_all(repos.atom, "a model", "2026-05-01T10:00:00+00:00")
    write_files(repos.atom, {MODEL: NIGHT2, FRESH: FRESH_TEXT})
    second = commit_all(repos.atom, "decode changed", "2026-05-02T10:00:00+00:00")
    cache = tmp_path / "cache"
    run_check(atom, first, aiter, repos.a["A4"], cache_dir=cache)

    where = tmp_path / "pids"
    since, fresh = workers.scan_file_since, workers.scan_file

    def said(path: str) -> None:
        with where.open("a") as f:  # (a child's memory is its own: the file says who scanned)
            f.write(f"{os.getpid()} {path}\n")

    def spy_since(data: bytes, path: str, before: Any) -> Any:
        said(path)
        return since(data, path, before)

    def spy_fresh(data: bytes, path: str) -> Any:
        said(path)
        return fresh(data, path)

    monkeypatch.setattr(workers, "scan_file_since", spy_since)
    monkeypatch.setattr(workers, "scan_file", spy_fresh)
    monkeypatch.setattr(workers, "RESCAN_MIN_BYTES", 0)
    monkeypatch.setattr(workers, "HELP", False)  # (the child takes every job: see test_compat_child)
    got = run_check(atom, second, aiter, repos.a["A4"], cache_dir=cache)
    monkeypatch.undo()
    pids = [line.split() for line in where.read_text().splitlines()]
    assert sorted(p for _, p in pids) == sorted([FRESH, MODEL])  # (changed, and new: no earlier scan)
    assert {int(pid) for pid, _ in pids} - {os.getpid()} == {int(pids[0][0])}
    cold = run_check(atom, second, aiter, repos.a["A4"], cache_dir=tmp_path / "cold")
    assert _said(got) == _said(cold)
    assert any(f.path == FRESH for f in got.findings)
    blob = git(repos.atom, "rev-parse", f"{second}:{MODEL}")
    night = SummaryCache.open("atom", cache).data[f"{blob}:{MODEL}"]
    fresh = SummaryCache.open("atom", tmp_path / "cold").data[f"{blob}:{MODEL}"]
    assert night == fresh


def test_no_garbage_collection_runs_during_a_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from pipeline.compat.checker import Checker

    repos = build_compat_repos(tmp_path / "fx")
    ran: list[int] = []
    checking = [False]
    real = Checker.check

    def check(self: Checker, *a: Any, **k: Any) -> Any:
        checking[0] = True
        try:
            return real(self, *a, **k)
        finally:
            checking[0] = False

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and checking[0]:
            ran.append(info["generation"])

    monkeypatch.setattr(Checker, "check", check)
    gc.callbacks.append(seen)
    threshold = gc.get_threshold()
    gc.set_threshold(1)  # (else a collection at almost every allocation)
    try:
        run_check(
            GitRepo(repos.atom), repos.t["T1"], GitRepo(repos.aiter), repos.a["A4"], cache_dir=tmp_path / "c"
        )
        assert ran == [] and gc.isenabled()
        checking[0] = True
        gc.collect()
        assert ran  # (the spy sees collections when they run)
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*threshold)
        gc.unfreeze()


def test_the_pins_tree_is_listed_while_the_checker_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiter's tree at the pin (the check's first read) is listed by git begun before it is asked
    for (`checker.begin_tree`), not by a git run then; the report is the same."""
    repos = build_compat_repos(tmp_path / "fx")
    pin = git(repos.aiter, "rev-parse", repos.a["A4"])
    asked = _git_runs(monkeypatch)
    got = run_check(GitRepo(repos.atom), repos.t["T1"], GitRepo(repos.aiter), pin, cache_dir=tmp_path / "c")
    assert not [a for a in asked if a[:1] == ("ls-tree",) and pin in a]  # (git begun earlier listed it)
    monkeypatch.undo()
    cold = run_check(GitRepo(repos.atom), repos.t["T1"], GitRepo(repos.aiter), pin, cache_dir=tmp_path / "d")
    assert _said(got) == _said(cold) and got.findings


def _git_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The arguments of every git command run (not begun early) from now on."""
    runs: list[tuple[str, ...]] = []
    real = GitRepo.git

    def spy(self: GitRepo, *args: str, **kw: Any) -> Any:
        runs.append(args)
        return real(self, *args, **kw)

    monkeypatch.setattr(GitRepo, "git", spy)
    return runs


def _checker(repos: Any, cache: Path) -> Any:
    from pipeline.compat.checker import Caches, Checker, aiter_tip, resolve_sha

    aiter, atom = GitRepo(repos.aiter), GitRepo(repos.atom)
    pin = resolve_sha(aiter, repos.a["A4"], "aiter")
    caches = Caches.open(cache)
    return Checker(atom, resolve_sha(atom, repos.t["T1"], "ATOM"), aiter, caches, tip=aiter_tip(aiter, pin))


def test_a_signature_at_a_commit_no_index_was_built_for_is_kept_across_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finding's baseline (aiter when its lines were written) is asked every night: its callee's
    signature there is kept, and the next run lists no tree of that commit to answer it again."""
    repos = build_compat_repos(tmp_path / "fx")
    old = git(repos.aiter, "rev-parse", repos.a["A2"])
    first = _checker(repos, tmp_path / "c")
    call = next(c for f in first.files for c in f.calls if c.ref == ("aiter.mla", ("mla_decode_fwd",)))
    sig = first._sig_at(old, call)
    assert sig is not None and sig.name == "mla_decode_fwd"
    first.index(first.tip)  # (an index built otherwise, as the pin's: nothing is kept for it)
    assert first._sig_at(first.tip, call) is not None
    first.caches.close()
    first.caches.save()

    facts = SummaryCache.open("facts", tmp_path / "c").data
    assert facts.has(f"sig-at:{old}:{call.ref!r}") and not facts.has(f"sig-at:{first.tip}:{call.ref!r}")

    listed = _git_runs(monkeypatch)
    again = _checker(repos, tmp_path / "c")
    assert again._sig_at(old, call) == sig
    assert not [a for a in listed if a[:1] == ("ls-tree",) and old in a]
    assert old not in again._index
    again.caches.close()


def test_the_modules_a_star_import_names_are_kept_per_blob(tmp_path: Path) -> None:
    """`from .x import *` chains are walked from cached text facts: a later run over the same blobs
    reads none of them (a night resolves through aiter/__init__.py's unchanged star-imports)."""
    from pipeline.compat.aiterapi import ApiIndex
    from pipeline.compat.pysource import Tree

    repos = build_compat_repos(tmp_path / "fx")
    aiter = GitRepo(repos.aiter)
    pin = git(repos.aiter, "rev-parse", repos.a["A4"])

    def index(cache: SummaryCache) -> ApiIndex:
        return ApiIndex(Tree.load(aiter, pin, prefix="aiter"), cache)

    first = SummaryCache.open("aiter", tmp_path / "c")
    idx = index(first)
    path = idx.mods["aiter"]
    targets = idx._star_targets("aiter", path, idx.tree.blobs[path])
    assert targets  # (the fixture's aiter/__init__.py star-imports)
    first.save()

    later = SummaryCache.open("aiter", tmp_path / "c")
    idx2 = index(later)
    read: list[object] = []
    idx2.tree.repo.read_blobs = lambda shas: read.append(shas) or iter(())  # type: ignore[method-assign]
    assert idx2._star_targets("aiter", path, idx2.tree.blobs[path]) == targets
    assert read == []


def test_the_changed_aiter_modules_the_last_night_read_are_summarized_in_a_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aiter modules the last check summarized that changed since are summarized in a forked
    child while the checker binds the calls that did not change; report as cold."""
    import os

    from pipeline.compat import workers

    repos = build_compat_repos(tmp_path / "fx")
    atom, aiter = GitRepo(repos.atom), GitRepo(repos.aiter)
    cache = tmp_path / "cache"
    run_check(atom, repos.t["T3"], aiter, repos.a["A4"], cache_dir=cache)
    git(repos.aiter, "checkout", "-q", repos.a["A4"])
    norm = (repos.aiter / "aiter/ops/norm.py").read_text()
    write_files(repos.aiter, {"aiter/ops/norm.py": norm + "\n\ndef rms_norm2(x, w):\n    return x\n"})
    pin = commit_all(repos.aiter, "A5: a function added beside rms_norm", "2026-06-01T10:00:00+00:00")

    where = tmp_path / "pids"
    real = workers.summarize_module

    def spy(data: bytes, path: str, module: str) -> Any:
        with where.open("a") as f:  # (a child's memory is its own: the file says who summarized)
            f.write(f"{os.getpid()} {path}\n")
        return real(data, path, module)

    monkeypatch.setattr(workers, "summarize_module", spy)
    got = run_check(atom, repos.t["T3"], aiter, pin, cache_dir=cache)
    monkeypatch.undo()
    changed = set(git(repos.aiter, "diff", "--name-only", repos.a["A4"], pin).split())
    ahead = [line.split() for line in where.read_text().splitlines()]
    assert ahead and {p for _, p in ahead} <= changed
    assert {int(pid) for pid, _ in ahead} - {os.getpid()} == {int(ahead[0][0])} != {os.getpid()}
    cold = run_check(atom, repos.t["T3"], aiter, pin, cache_dir=tmp_path / "cold")
    assert _said(got) == _said(cold) and got.findings


def test_which_ops_a_nights_changed_aiter_files_name_is_read_in_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`torch.ops.aiter.<op>` is found through the aiter files that name it: the night's changed
    files are searched for the last night's op names in the child, not read by the checker."""
    import os

    from pipeline.compat import aiterapi, workers
    from tests.fixtures.gitfixture import init_repo

    atom, aiter = init_repo(tmp_path / "atom"), init_repo(tmp_path / "aiter")
    register = 'def {f}({params}):\n    pass\n\n\ndirect_register_custom_op("norm_op", {f})\n'
    files = {"aiter/__init__.py": "", "aiter/ops/__init__.py": ""}
    write_files(aiter, {**files, "aiter/ops/norm.py": register.format(f="norm_impl", params="x, eps")})
    commit_all(aiter, "A0", "2026-01-01T00:00:00+00:00")
    caller = "import torch\n\n\ndef run(x):\n    return torch.ops.aiter.norm_op(x, 1e-6)\n"
    write_files(atom, {"atom/__init__.py": "", "atom/m.py": caller})
    t0 = commit_all(atom, "T0", "2026-01-02T00:00:00+00:00")
    cache = tmp_path / "cache"
    assert not run_check(GitRepo(atom), t0, GitRepo(aiter), "HEAD", cache_dir=cache).findings
    # A file before norm.py in path order now registers the op, taking one argument.
    early_text = register.format(f="early_impl", params="x")
    write_files(aiter, {"aiter/ops/early.py": early_text})
    a1 = commit_all(aiter, "A1", "2026-01-05T00:00:00+00:00")

    where = tmp_path / "pids"
    real = workers.says_word

    def spy(text: bytes, name: bytes) -> bool:
        with where.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real(text, name)

    searched: list[bytes] = []
    here = aiterapi.says_word

    def searched_here(text: bytes, name: bytes) -> bool:
        searched.append(text)
        return here(text, name)

    monkeypatch.setattr(workers, "says_word", spy)
    monkeypatch.setattr(aiterapi, "says_word", searched_here)
    got = run_check(GitRepo(atom), t0, GitRepo(aiter), a1, cache_dir=cache)
    monkeypatch.undo()
    assert {int(p) for p in where.read_text().split()} - {os.getpid()}  # (a child searched)
    assert early_text.encode() not in searched  # (the checker searched no changed file for the op)
    assert [f.line for f in got.findings] == [5]
    cold = run_check(GitRepo(atom), t0, GitRepo(aiter), a1, cache_dir=tmp_path / "cold")
    assert _said(got) == _said(cold)
    assert aiterapi.OPS_AHEAD not in SummaryCache.open("aiter", cache).data


def test_a_kept_scan_this_code_cannot_read_is_scanned_again(tmp_path: Path) -> None:
    """The cached scans are unpickled only as they are read (after the night's child is forked):
    one that no longer unpickles is found then, and that file is scanned again there."""
    import pickle
    import shutil

    from pipeline.compat.pysource import LAZY_FORMAT, SCHEMA

    repos = build_compat_repos(tmp_path / "fx")
    atom, aiter = GitRepo(repos.atom), GitRepo(repos.aiter)
    cache = tmp_path / "cache"
    first = run_check(atom, repos.t["T1"], aiter, repos.a["A4"], cache_dir=cache)
    f = cache / f"compat-atom-v{SCHEMA}.pickle"
    fmt, entries = pickle.loads(f.read_bytes())
    assert fmt == LAZY_FORMAT
    spoiled = [k for k in entries if k.endswith(first.findings[0].path)]
    assert spoiled
    entries[spoiled[0]] = b"not a pickle"
    f.write_bytes(pickle.dumps((fmt, entries)))
    shutil.rmtree(cache / f"compat-reports-v{SCHEMA}")
    again = run_check(atom, repos.t["T1"], aiter, repos.a["A4"], cache_dir=cache)
    assert _said(again) == _said(first)
