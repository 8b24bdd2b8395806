"""Mirrors and ref resolution against fixture upstream repositories made by the tests."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from pipeline import sources
from pipeline.config import Settings, load_settings
from pipeline.errors import InfraError, SourceError
from pipeline.gitw import GitRepo
from pipeline.log import Logger
from pipeline.sources import mirror_path, open_mirror, resolve_ref
from tests.fixtures.upstream_repos import FixtureRepo, Upstreams, free_port, git_daemon

pytestmark = pytest.mark.usefixtures("fast_backoff")  # (tests/git/conftest.py)


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    return load_settings(
        env={},
        cwd=tmp_path,
        overrides={"cache_dir": str(tmp_path / "cache"), "locks_dir": str(tmp_path / "locks"), **overrides},
    )


def make_log() -> tuple[Logger, io.StringIO]:
    buf = io.StringIO()
    return Logger(verbosity=1, stream=buf), buf


def closed_port_url() -> str:
    return f"git://127.0.0.1:{free_port()}/nothing-here"


# -- ref kinds --------------------------------------------------------------------------------


def test_every_ref_kind_resolves_to_the_full_sha(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    atom = open_mirror(s, ups.atom.url)
    aiter = open_mirror(s, ups.aiter.url)
    url = ups.atom.url
    a1, a2 = ups.shas["atom_1"], ups.shas["atom_2"]
    cases = {
        "main": a2,  # branch
        "dev": a1,  # another branch
        "v1.0": a1,  # lightweight tag
        a1: a1,  # full SHA
        a1[:7]: a1,  # short SHA
        a1[:7].upper(): a1,  # short SHA, upper case
        "HEAD": a2,
        "refs/heads/dev": a1,
        "main~1": a1,
    }
    for ref, want in cases.items():
        info = resolve_ref(atom, ref, url=url)
        assert info.sha == want, ref
        assert len(info.sha) == 40
    # annotated tag is peeled to its commit (not the tag object)
    tag_obj = ups.aiter.git("rev-parse", "refs/tags/v0.1")
    info = resolve_ref(aiter, "v0.1", url=ups.aiter.url)
    assert info.sha == ups.shas["aiter_old"] != tag_obj
    assert resolve_ref(aiter, "release/v0.1", url=ups.aiter.url).sha == ups.shas["aiter_old"]
    # commit metadata comes with it
    head = resolve_ref(atom, "main", url=url)
    assert head.subject == "Add README"
    assert head.iso_date.endswith("Z")


def test_unknown_ref_names_repo_and_nearest_refs(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    atom = open_mirror(s, ups.atom.url)
    with pytest.raises(SourceError) as ei:
        resolve_ref(atom, "mian", url=ups.atom.url, name="ATOM")
    msg = str(ei.value)
    assert ups.atom.url in msg and "'mian'" in msg and "ATOM" in msg
    assert "Nearest refs: main" in msg

    with pytest.raises(SourceError) as ei:
        resolve_ref(atom, "deadbeef12", url=ups.atom.url)
    assert "looks like a commit SHA" in str(ei.value)

    # a full SHA that exists upstream in another repository is not in this one
    with pytest.raises(SourceError):
        resolve_ref(atom, ups.shas["aiter_old"], url=ups.atom.url)


def test_branch_and_tag_with_same_name_at_different_commits_is_ambiguous(
    tmp_path: Path, ups: Upstreams
) -> None:
    ups.atom.tag("dev", ups.shas["atom_2"])  # branch dev is at atom_1
    atom = open_mirror(make_settings(tmp_path), ups.atom.url)
    with pytest.raises(SourceError, match="both a branch and a tag"):
        resolve_ref(atom, "dev", url=ups.atom.url)
    assert resolve_ref(atom, "refs/tags/dev", url=ups.atom.url).sha == ups.shas["atom_2"]


def _many_commits(repo: FixtureRepo, n: int) -> None:
    """n commits on branch `many` in one `git fast-import` (deterministic SHAs)."""
    stream = []
    for i in range(n):
        stream.append(
            f"commit refs/heads/many\nmark :{i + 1}\n"
            f"committer C <c@fixture.invalid> {1_781_000_000 + i} +0000\n"
            f"data {len(f'commit {i}')}\ncommit {i}\n" + ("" if i == 0 else f"from :{i}\n") + "\n"
        )
    subprocess.run(
        ["git", "fast-import", "--quiet"],
        cwd=repo.path,
        input="".join(stream).encode(),
        check=True,
        capture_output=True,
    )


def test_ambiguous_short_sha_lists_candidates(tmp_path: Path, ups: Upstreams) -> None:
    _many_commits(ups.atom, 1200)
    atom = open_mirror(make_settings(tmp_path), ups.atom.url)
    shas = atom.git("rev-list", "refs/heads/many").split()
    by_prefix: dict[str, list[str]] = {}
    for sha in shas:
        by_prefix.setdefault(sha[:4], []).append(sha)
    prefix, clash = next((p, c) for p, c in sorted(by_prefix.items()) if len(c) > 1)
    with pytest.raises(SourceError) as ei:
        resolve_ref(atom, prefix, url=ups.atom.url)
    msg = str(ei.value)
    assert "ambiguous" in msg
    for sha in clash:
        assert sha[:12] in msg
    # one more digit (when it separates them) resolves
    longer = clash[0][:12]
    assert resolve_ref(atom, longer, url=ups.atom.url).sha == clash[0]


# -- mirrors ------------------------------------------------------------------------------------


def test_incremental_fetch_sees_new_commits_and_pruned_branches(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    log, buf = make_log()
    atom = open_mirror(s, ups.atom.url, log=log)
    assert "mirrored" in buf.getvalue()
    pinned = ups.shas["atom_1"]
    sources.keep_pinned(atom, pinned)
    inode_before = atom.path.stat().st_ino

    new = ups.atom.commit({"atom/new.py": "x = 1\n"}, "New upstream work")
    ups.atom.branch("feature")
    ups.atom.delete_branch("dev")
    ups.atom.git("tag", "-d", "v1.0")
    # rewrite history so atom_1 is unreachable from every upstream ref
    ups.atom.git("checkout", "-q", "--orphan", "rewritten")
    ups.atom.commit({"x": "y"}, "Rewritten root")
    ups.atom.git("branch", "-D", "main")
    ups.atom.git("branch", "-m", "main")
    ups.atom.branch("old-main", new)

    atom2 = open_mirror(s, ups.atom.url, log=log)
    assert atom2.path == atom.path
    # incremental: the same mirror directory was fetched into, not re-created
    assert atom2.path.stat().st_ino == inode_before
    assert buf.getvalue().count("mirrored") == 1
    assert "fetched" in buf.getvalue()
    assert resolve_ref(atom2, "old-main", url="u").sha == new
    assert resolve_ref(atom2, "feature", url="u").sha == ups.atom.head("feature")
    assert resolve_ref(atom2, "main", url="u").subject == "Rewritten root"
    with pytest.raises(SourceError):
        resolve_ref(atom2, "dev", url="u")  # pruned
    with pytest.raises(SourceError):
        resolve_ref(atom2, "v1.0", url="u")  # pruned tag
    # the pinned commit survives the prune and a gc
    atom2.git("gc", "--prune=now", "--quiet")
    assert atom2.rev_parse(pinned) == pinned


def test_fetch_updates_the_mirror_head_to_the_remote_default_branch(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    open_mirror(s, ups.atom.url)
    ups.atom.checkout("dev")
    atom = open_mirror(s, ups.atom.url)
    assert resolve_ref(atom, "HEAD", url="u").sha == ups.shas["atom_1"]


def test_offline_use_of_an_existing_mirror(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    open_mirror(s, ups.atom.url)
    moved = tmp_path / "moved-away"
    shutil.move(str(ups.atom.path), moved)  # upstream path gone
    log, buf = make_log()
    atom = open_mirror(s, ups.atom.url, log=log)
    assert "existing mirror" in buf.getvalue()
    assert resolve_ref(atom, "main", url="u").sha == ups.shas["atom_2"]
    # fetch=False never needs the upstream at all
    assert resolve_ref(open_mirror(s, ups.atom.url, fetch=False), "dev", url="u").sha == ups.shas["atom_1"]
    # but a ref the mirror does not have still fails
    with pytest.raises(SourceError):
        resolve_ref(atom, "not-fetched-yet", url=ups.atom.url)


def test_offline_when_the_remote_url_is_unreachable(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    with git_daemon(ups.root) as d:
        url = d.url("ATOM")
        open_mirror(s, url)
    # daemon stopped: the URL is unreachable now
    log, buf = make_log()
    atom = open_mirror(s, url, log=log, retries=1)
    out = buf.getvalue()
    assert "attempt 1/2" in out and "OFFLINE" in out and "existing mirror" in out
    assert resolve_ref(atom, "v1.0", url=url).sha == ups.shas["atom_1"]


def test_unreachable_url_retries_then_infra_error(tmp_path: Path) -> None:
    s = make_settings(tmp_path, fetch_retries=2)
    url = closed_port_url()
    log, buf = make_log()
    with pytest.raises(InfraError) as ei:
        open_mirror(s, url, log=log)
    assert url in str(ei.value) and "3 attempts" in str(ei.value)
    assert buf.getvalue().count("unreachable (attempt") == 2
    assert not mirror_path(s, url).exists()  # nothing half-done
    assert list(s.mirrors_dir.glob("*.tmp")) == []


def test_missing_local_path_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        open_mirror(make_settings(tmp_path), str(tmp_path / "nope"))


def test_local_path_that_is_not_a_repository_fails_without_retries(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "file.txt").write_text("not a repo")
    log, buf = make_log()
    with pytest.raises(SourceError, match="is a directory but not a git repository") as ei:
        open_mirror(make_settings(tmp_path), str(plain), log=log)
    assert not isinstance(ei.value, InfraError)
    assert "does not exist" not in str(ei.value)  # it exists: say what it is instead
    assert "retrying" not in buf.getvalue()


def test_progress_lines_are_streamed_for_long_fetches(tmp_path: Path, ups: Upstreams) -> None:
    ups.atom.add_big_commit(4, files=120)
    lines: list[str] = []
    log, buf = make_log()
    open_mirror(make_settings(tmp_path), ups.atom.file_url, progress=lines.append, log=log)
    assert any(ln.startswith("Receiving objects") for ln in lines)
    assert any("100%" in ln and ln.endswith("done.") for ln in lines if ln.startswith("Receiving objects"))
    # throttled: not one line per percent
    assert sum(ln.startswith("Receiving objects") for ln in lines) < 20
    assert f"mirrored {ups.atom.file_url} in " in buf.getvalue()


def test_no_mirror_and_no_fetch_is_a_source_error(tmp_path: Path, ups: Upstreams) -> None:
    with pytest.raises(SourceError, match="no mirror"):
        open_mirror(make_settings(tmp_path), ups.atom.url, fetch=False)


def test_served_by_file_url_and_git_daemon(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    by_file = open_mirror(s, ups.atom.file_url)
    assert resolve_ref(by_file, "main", url="u").sha == ups.shas["atom_2"]
    with git_daemon(ups.root) as d:
        by_daemon = open_mirror(s, d.url("ATOM"))
        assert by_daemon.path != by_file.path
        assert resolve_ref(by_daemon, "v1.0", url="u").sha == ups.shas["atom_1"]
        new = ups.atom.commit({"n": "1"}, "over git://")
        assert resolve_ref(open_mirror(s, d.url("ATOM")), "main", url="u").sha == new


def test_mirroring_from_a_partial_bare_repo_without_config(tmp_path: Path, ups: Upstreams) -> None:
    """Like the real mirrors: bare, blobs filtered out (promisor pack), no `config` file."""
    ups.atom.git("config", "uploadpack.allowFilter", "true")
    partial = tmp_path / "partial.git"
    subprocess.run(
        ["git", "clone", "-q", "--bare", "--filter=blob:none", ups.atom.file_url, str(partial)],
        check=True,
        capture_output=True,
    )
    assert list((partial / "objects" / "pack").glob("*.promisor"))
    (partial / "config").unlink()
    s = make_settings(tmp_path)
    repo = open_mirror(s, str(partial))
    assert resolve_ref(repo, "main", url="u").sha == ups.shas["atom_2"]
    # a second run fetches incrementally from it
    again = open_mirror(s, str(partial))
    assert resolve_ref(again, "v1.0", url="u").sha == ups.shas["atom_1"]
    # served through upload-pack (file://) it cannot send the blobs it lacks: say so
    with pytest.raises(SourceError, match="missing objects") as ei:
        open_mirror(s, partial.as_uri())
    assert "plain path" in str(ei.value)


def test_two_runs_share_a_mirror_safely(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    results: list[GitRepo] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(open_mirror(s, ups.aiter.url))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert {r.path for r in results} == {mirror_path(s, ups.aiter.url)}
    assert resolve_ref(results[0], "main", url="u").sha == ups.shas["aiter_split"]


def test_stale_git_lock_from_a_killed_run_is_cleared(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path)
    killed_clone = s.mirrors_dir / f".{mirror_path(s, ups.atom.url).name}.abc123.tmp"
    (killed_clone / "repo.git").mkdir(parents=True)
    atom = open_mirror(s, ups.atom.url)
    assert not killed_clone.exists()
    (atom.path / "refs" / "heads" / "main.lock").write_text("")
    new = ups.atom.commit({"z": "1"}, "after the crash")
    log, buf = make_log()
    assert resolve_ref(open_mirror(s, ups.atom.url, log=log), "main", url="u").sha == new
    assert "stale git lock" in buf.getvalue()


# -- the one git wrapper ----------------------------------------------------------------------


def test_git_failures_keep_stderr_as_evidence_and_big_output_does_not_block(
    tmp_path: Path, ups: Upstreams
) -> None:
    repo = GitRepo(ups.atom.path)
    with pytest.raises(SourceError) as e:
        repo.git("cat-file", "-p", "no-such-ref:file")
    assert e.value.evidence and "no-such-ref" in e.value.evidence
    assert "failed in" in e.value.message and e.value.message.endswith(".")
    # megabytes on stdout: both pipes are read as data comes, so git never blocks on a full one
    ups.atom.add_big_commit(2, files=40)
    res = sources.mirrors.run_git(["-C", str(ups.atom.path), "cat-file", "--batch-all-objects", "--batch"])
    assert res.ok and len(res.stdout) > 1_000_000


def test_interrupted_git_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while git streams progress: the child dies with us, nothing keeps running."""
    fake = tmp_path / "bin" / "git"
    fake.parent.mkdir()
    pid_file = tmp_path / "git.pid"
    fake.write_text(
        f"#!/bin/sh\necho $$ > {pid_file}\necho 'Receiving objects:   1% (1/100)' >&2\nexec sleep 60\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sources.mirrors.run_git(["fetch", "--progress", "origin"], progress=interrupt)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


def test_a_clone_over_git_shows_its_objects_as_progress(tmp_path: Path, ups: Upstreams) -> None:
    from pipeline.progress import Progress
    from pipeline.sources.mirrors import FetchProgress

    log, _ = make_log()
    out = io.StringIO()  # not a terminal: plain lines, as on CI
    shown = FetchProgress(log, "ATOM", after=0, progress=Progress(out, live=False, interval_s=0))
    with git_daemon(ups.root) as d:
        open_mirror(make_settings(tmp_path), d.url("ATOM"), progress=shown)
    shown.close()
    lines = out.getvalue().splitlines()
    received = [ln for ln in lines if "Receiving objects" in ln]
    assert received, lines
    last = received[-1]  # git's own count, done of total
    n, total = (int(x.strip(" /")) for x in last.split("fetch ATOM: ", 1)[1].split("objects")[:2])
    assert n == total > 0 and "(100%)" in last, last
    assert "s elapsed (done)" in lines[-1]  # the closing line
    assert all("\x1b[" not in ln for ln in lines)  # no escape codes off a terminal
