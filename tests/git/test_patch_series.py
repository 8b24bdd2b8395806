"""The patch series against fixture ATOM/aiter repositories: check, apply, refusals, round trip."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode, PatchError
from pipeline.gitw import GitRepo
from pipeline.lock import BaseImagePin, Lock, SourcePin, Sources
from pipeline.patchq import (
    PatchSeries,
    apply_series,
    check_series,
    export_series,
    import_series,
    new_patch,
    patched_commit,
)
from pipeline.patchq.apply import refs_snapshot
from tests.fixtures.patch_repos import (
    FIXED_FILE,
    MODEL,
    OLD_FILE,
    README_DIFF,
    AiterFixture,
    AtomFixture,
    git,
    make_aiter,
    make_atom,
    make_fix_commit,
    patch_text,
    write_series,
)


@pytest.fixture
def atom(tmp_path: Path) -> AtomFixture:
    return make_atom(tmp_path / "repos")


@pytest.fixture
def aiter(tmp_path: Path) -> AiterFixture:
    return make_aiter(tmp_path / "repos")


def _trailers(atom: AtomFixture, *, end: bool = True) -> str:
    rng = f"{atom.c1[:12]}..{atom.c3[:12] if end else ''}"
    return (
        "Origin: vendor\n"
        "Forwarded: not-needed\n"
        "Last-Update: 2026-06-25\n"
        f"X-Atom-Range: {rng}\n"
        "X-Aiter-Requires: fused_qknorm_idxrqknorm has kv_cache_v\n"
        "X-Patch-Version: 1\n"
    )


def _series(atom: AtomFixture, tmp_path: Path, *, end: bool = True, name: str = "fix") -> PatchSeries:
    """The fix exported from a commit on top of c2, as the release engineer does it."""
    wt = make_fix_commit(atom, tmp_path, base=atom.c2, trailers=_trailers(atom, end=end), name=name)
    directory = tmp_path / f"patches-{name}"
    export_series(GitRepo(wt), atom.c2, "HEAD", directory)
    return PatchSeries.load(directory)


def _state(repo: Path) -> tuple[dict[str, str], str, str]:
    """Everything apply must leave untouched on failure: refs, worktree list, HEAD's files."""
    r = GitRepo(repo)
    worktrees = git(repo, "worktree", "list", "--porcelain")
    return refs_snapshot(r), worktrees, git(repo, "ls-tree", "-r", "HEAD")


# -- check ---------------------------------------------------------------------------


def test_check_reports_each_status(atom: AtomFixture, aiter: AiterFixture, tmp_path: Path) -> None:
    series = _series(atom, tmp_path)
    a, ai = GitRepo(atom.mirror), GitRepo(aiter.repo)

    def status(atom_sha: str, aiter_sha: str) -> tuple[str, str]:
        (c,) = check_series(series, a, atom_sha, ai, aiter_sha)
        return c.status, c.reason

    assert status(atom.c2, aiter.a1)[0] == "applies"
    assert status(atom.c1, aiter.a1)[0] == "applies"  # the range start itself
    st, why = status(atom.c2, aiter.a0)
    assert st == "not-needed" and "lacks kv_cache_v" in why
    st, why = status(atom.c3, aiter.a1)
    assert st == "not-needed" and "past its range" in why
    st, why = status(atom.c0, aiter.a1)
    assert st == "not-needed" and "does not contain" in why


def test_check_already_upstream_when_the_reverse_applies(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    series = _series(atom, tmp_path, end=False)  # open range: c3 is "in range"
    (c,) = check_series(series, GitRepo(atom.mirror), atom.c3, GitRepo(aiter.repo), aiter.a1)
    assert c.status == "already-upstream", c.line()


def test_check_conflict_names_the_failing_hunk_and_tries_three_way(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    series = _series(atom, tmp_path)
    before = _state(atom.mirror)
    (c,) = check_series(series, GitRepo(atom.mirror), atom.c4, GitRepo(aiter.repo), aiter.a1)
    assert c.status == "conflict"
    # the dense-attention hunk still applies; the sparse one does not
    assert len(c.hunks) == 1 and c.hunks[0].startswith(f"{MODEL} @@ -")
    assert "conflicts in atom/models/minimax_m3.py" in c.three_way
    assert _state(atom.mirror) == before  # check never writes refs


def test_aiter_after_condition(atom: AtomFixture, aiter: AiterFixture, tmp_path: Path) -> None:
    text = patch_text(
        atom_range=f"{atom.c1[:10]}..", diff=README_DIFF, extra=f"X-Aiter-After: {aiter.a1[:10]}\n"
    )
    d = write_series(tmp_path / "p", {"0001-readme.patch": text})
    series = PatchSeries.load(d)
    a, ai = GitRepo(atom.mirror), GitRepo(aiter.repo)
    assert check_series(series, a, atom.c2, ai, aiter.a1)[0].status == "applies"
    c = check_series(series, a, atom.c2, ai, aiter.a0)[0]
    assert c.status == "not-needed" and "does not contain" in c.reason


def test_unknown_range_commit_is_a_patch_error(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    text = patch_text(atom_range="deadbeefdead..", diff=README_DIFF)
    series = PatchSeries.load(write_series(tmp_path / "p", {"0001-readme.patch": text}))
    with pytest.raises(PatchError, match="deadbeefdead"):
        check_series(series, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1)


# -- apply ---------------------------------------------------------------------------


def test_apply_makes_one_deterministic_commit_per_patch(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    series = _series(atom, tmp_path)
    a = GitRepo(atom.mirror)
    res = apply_series(series, a, atom.c2, GitRepo(aiter.repo), aiter.a1, workdir=tmp_path / "work")
    assert res.worktree is not None and res.branch is not None
    assert res.branch.startswith(f"refs/pipeline/patched/{atom.c2[:7]}-")  # not pruned by a fetch
    assert a.rev_parse(res.branch) == res.head_sha
    assert git(atom.mirror, "rev-parse", f"{res.head_sha}^") == atom.c2
    assert a.read_blob(res.head_sha, MODEL) == FIXED_FILE.encode()
    assert (res.worktree / MODEL).read_text() == FIXED_FILE
    info = a.commit_info(res.head_sha)
    assert info.subject == "minimax_m3: split KV cache for fused_qknorm_idxrqknorm"
    assert info.author == "Fixture Author"  # from the patch's From: header, not the environment
    [pin] = res.pins
    assert pin.status == "applied" and pin.sha256 == series.patches[0].sha256
    # same inputs, same commit; and the work-tree-free path makes that same commit
    again = apply_series(series, a, atom.c2, GitRepo(aiter.repo), aiter.a1, workdir=tmp_path / "work")
    assert again.head_sha == res.head_sha
    before = _state(atom.mirror)
    bare = patched_commit(series, a, atom.c2, GitRepo(aiter.repo), aiter.a1)
    assert bare.head_sha == res.head_sha and bare.pins == res.pins and bare.worktree is None
    assert _state(atom.mirror) == before  # no ref, no work tree


def test_apply_after_the_work_tree_was_deleted_by_hand(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    series = _series(atom, tmp_path)
    args = (series, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1)
    first = apply_series(*args, workdir=tmp_path / "work")
    assert first.worktree is not None
    shutil.rmtree(first.worktree)  # the branch is still "checked out" there for git
    again = apply_series(*args, workdir=tmp_path / "work")
    assert again.head_sha == first.head_sha and again.worktree == first.worktree
    assert (first.worktree / MODEL).read_text() == FIXED_FILE


def test_apply_drops_not_needed_patch_with_a_note(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    series = _series(atom, tmp_path)
    before = _state(atom.mirror)
    res = apply_series(
        series, GitRepo(atom.mirror), atom.c3, GitRepo(aiter.repo), aiter.a1, workdir=tmp_path / "work"
    )
    assert res.head_sha == atom.c3 and res.worktree is None
    assert [p.status for p in res.pins] == ["not-needed"]
    assert any("not needed" in n and "past its range" in n for n in res.notes)
    assert _state(atom.mirror) == before


def test_apply_conflict_is_all_or_nothing(atom: AtomFixture, aiter: AiterFixture, tmp_path: Path) -> None:
    good = patch_text(atom_range=f"{atom.c1[:10]}..", diff=README_DIFF, subject="readme")
    fix = _series(atom, tmp_path).patches[0].path.read_text()
    d = write_series(tmp_path / "mixed", {"0001-readme.patch": good, "0002-fix.patch": fix})
    series = PatchSeries.load(d)
    before = _state(atom.mirror)
    objects_before = git(atom.mirror, "count-objects", "-v")
    with pytest.raises(PatchError) as err:
        apply_series(
            series, GitRepo(atom.mirror), atom.c4, GitRepo(aiter.repo), aiter.a1, workdir=tmp_path / "w"
        )
    msg = str(err.value)
    assert "0002-fix.patch" in msg and f"{MODEL} @@ -" in msg
    assert _state(atom.mirror) == before
    assert git(atom.mirror, "count-objects", "-v") == objects_before
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())


def test_apply_failure_midway_restores_refs_and_removes_work_tree(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after commits were made (here: the second commit) leaves nothing behind."""
    import pipeline.patchq.apply as mod

    good = patch_text(atom_range=f"{atom.c1[:10]}..", diff=README_DIFF, subject="readme")
    fix = _series(atom, tmp_path).patches[0].path.read_text()
    series = PatchSeries.load(
        write_series(tmp_path / "two", {"0001-readme.patch": good, "0002-fix.patch": fix})
    )
    before = _state(atom.mirror)
    real = mod.commit_patch
    calls = []

    def flaky(repo: GitRepo, wt: Path, patch: object) -> str:
        calls.append(patch)
        if len(calls) == 2:
            raise PatchError("simulated failure in the second patch")
        return real(repo, wt, patch)  # type: ignore[arg-type]

    monkeypatch.setattr(mod, "commit_patch", flaky)
    with pytest.raises(PatchError, match="simulated"):
        apply_series(
            series, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1, workdir=tmp_path / "w"
        )
    assert len(calls) == 2
    assert _state(atom.mirror) == before
    assert [p.name for p in (tmp_path / "w").iterdir()] == []


def test_apply_refuses_a_dirty_work_tree(atom: AtomFixture, aiter: AiterFixture, tmp_path: Path) -> None:
    series = _series(atom, tmp_path)
    args = (series, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1)
    res = apply_series(*args, workdir=tmp_path / "work")
    assert res.worktree is not None
    (res.worktree / "README.md").write_text("local edit\n")
    before = _state(atom.mirror)
    with pytest.raises(PatchError, match="local changes"):
        apply_series(*args, workdir=tmp_path / "work")
    assert (res.worktree / "README.md").read_text() == "local edit\n"
    assert _state(atom.mirror) == before


def test_apply_refuses_path_traversal_before_touching_anything(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    evil = README_DIFF.replace("a/README.md", "a/../../evil").replace("b/README.md", "b/../../evil")
    d = write_series(
        tmp_path / "p", {"0001-evil.patch": patch_text(atom_range=f"{atom.c1[:10]}..", diff=evil)}
    )
    with pytest.raises(PatchError, match="outside the repository"):
        PatchSeries.load(d)
    assert not (tmp_path.parent / "evil").exists()


def test_apply_refuses_writing_through_a_symlink_in_the_tree(aiter: AiterFixture, tmp_path: Path) -> None:
    work = tmp_path / "atom-link"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / "README.md").write_text("ATOM\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (work / "outside").symlink_to(elsewhere)
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "init")
    base = git(work, "rev-parse", "HEAD")
    diff = (
        "diff --git a/outside/x b/outside/x\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/outside/x\n@@ -0,0 +1 @@\n+x\n"
    )
    d = write_series(tmp_path / "p", {"0001-link.patch": patch_text(atom_range=f"{base[:10]}..", diff=diff)})
    series = PatchSeries.load(d)
    before = _state(work)
    with pytest.raises(PatchError, match="symlink"):
        apply_series(series, GitRepo(work), base, GitRepo(aiter.repo), aiter.a1, workdir=tmp_path / "w")
    assert _state(work) == before
    assert list(elsewhere.iterdir()) == []


# -- the patch-queue round trip ----------------------------------------------------------


def test_export_then_import_gives_the_same_tree_and_files(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    # two commits made by hand on the pinned commit, without any header trailers
    wt = make_fix_commit(atom, tmp_path, base=atom.c2, name="hand")
    (wt / "atom/models/other.py").write_text("x = 2\n")
    git(wt, "commit", "-q", "-a", "-m", "other: bump x", date="2026-06-26T00:00:00+0000")
    tip_tree = git(wt, "rev-parse", "HEAD^{tree}")
    out = tmp_path / "exported"
    paths = export_series(GitRepo(wt), atom.c2, "HEAD", out)
    assert [p.name for p in paths] == [
        "0001-minimax-m3-split-kv-cache-for-fused-qknorm.patch",  # whole words, <= 52 chars
        "0002-other-bump-x.patch",
    ]
    series = PatchSeries.load(out)
    assert series.patches[0].field("X-Atom-Range") == f"{atom.c2[:12]}.."  # default: from the base
    assert series.patches[0].body == "Pass kv_cache_k and kv_cache_v to the new aiter signature."

    # import into another work tree on a branch, export again: same tree, same files
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(atom.mirror), str(clone))
    branch, head = import_series(series, GitRepo(clone), atom.c2)
    assert branch == f"patch-queue/{atom.c2[:7]}" and head == git(clone, "rev-parse", "HEAD")
    assert git(clone, "rev-parse", "HEAD^{tree}") == tip_tree
    assert git(clone, "rev-parse", "--abbrev-ref", "HEAD") == branch
    again = tmp_path / "again"
    export_series(GitRepo(clone), atom.c2, "HEAD", again)
    for p in paths:
        assert (again / p.name).read_bytes() == p.read_bytes()
    assert (again / "series").read_text() == (out / "series").read_text()
    # and applying the series gives that same tree too
    res = apply_series(
        series, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1, workdir=tmp_path / "w"
    )
    assert git(atom.mirror, "rev-parse", f"{res.head_sha}^{{tree}}") == tip_tree


def test_import_failure_leaves_the_work_tree_as_it_was(atom: AtomFixture, tmp_path: Path) -> None:
    series = _series(atom, tmp_path)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(atom.mirror), str(clone))
    before = _state(clone)
    with pytest.raises(PatchError, match="0001-"):
        import_series(series, GitRepo(clone), atom.c4)  # conflicts there
    assert _state(clone) == before
    assert git(clone, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git(clone, "status", "--porcelain") == ""


def test_import_refuses_a_dirty_tree(atom: AtomFixture, tmp_path: Path) -> None:
    series = _series(atom, tmp_path)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(atom.mirror), str(clone))
    (clone / "README.md").write_text("dirty\n")
    before = _state(clone)
    with pytest.raises(PatchError, match="uncommitted changes"):
        import_series(series, GitRepo(clone), atom.c2)
    assert _state(clone) == before and (clone / "README.md").read_text() == "dirty\n"


def test_new_appends_the_next_patch_with_headers(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    series = _series(atom, tmp_path)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(atom.mirror), str(clone))
    import_series(series, GitRepo(clone), atom.c2)
    (clone / "README.md").write_text("ATOM\n\nMiniMax-M3 recipe, patched.\n")
    git(clone, "commit", "-q", "-a", "-m", "docs: mention the patch", date="2026-06-27T00:00:00+0000")
    path = new_patch(
        GitRepo(clone),
        "HEAD",
        atom.c2,
        series.directory,
        overrides={"X-Aiter-After": aiter.a1[:10], "Bug": "https://example.invalid/1"},
    )
    assert path.name == "0002-docs-mention-the-patch.patch"
    s2 = PatchSeries.load(series.directory)
    assert [p.name for p in s2] == [series.patches[0].name, path.name]
    p = s2.patches[1]
    assert p.aiter_after == aiter.a1[:10] and p.field("Bug") == "https://example.invalid/1"
    assert str(p.atom_range) == f"{atom.c2[:12]}.."
    checks = check_series(s2, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1)
    assert [c.status for c in checks] == ["applies", "applies"]


# -- the command line ------------------------------------------------------------------


def _lock(path: Path, atom: AtomFixture, aiter: AiterFixture, atom_sha: str) -> Path:
    def pin(repo: Path, sha: str) -> SourcePin:
        c = GitRepo(repo).commit_info(sha)
        return SourcePin(url=str(repo), ref="main", sha=c.sha, date=c.iso_date, subject=c.subject)

    lock = Lock(
        model="M",
        sources=Sources(atom=pin(atom.mirror, atom_sha), aiter=pin(aiter.repo, aiter.a1)),
        base_image=BaseImagePin(ref="rocm/pytorch:test"),
    )
    lock.save(path)
    return path


def test_cli_check_apply_list(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    series = _series(atom, tmp_path)
    lock = _lock(tmp_path / "locks" / "M.toml", atom, aiter, atom.c2)
    common = ["--patches-dir", str(series.directory), "--lock", str(lock)]
    repos = ["--atom-repo", str(atom.mirror), "--aiter-repo", str(aiter.repo)]

    assert main(["patch", "list", "--patches-dir", str(series.directory)]) == 0
    assert "ATOM range" in capsys.readouterr().out

    assert main(["patch", "check", *common, *repos, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["status"] for p in data["patches"]] == ["applies"]

    assert main(["patch", "check", *common, *repos, "--atom", atom.c4]) == ExitCode.PATCH
    assert "conflict" in capsys.readouterr().out

    assert main(["patch", "apply", *common, *repos, "--workdir", str(tmp_path / "w")]) == 0
    said = capsys.readouterr().out.strip()
    assert said.startswith("patched ATOM: ")  # labelled, not a bare SHA
    head = said.split()[2]
    assert GitRepo(atom.mirror).read_blob(head, MODEL) == FIXED_FILE.encode()
    [pin] = Lock.load(lock).patches
    assert (pin.name, pin.sha256, pin.status) == (series.patches[0].name, series.patches[0].sha256, "applied")


def test_cli_import_export(atom: AtomFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    series = _series(atom, tmp_path)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(atom.mirror), str(clone))
    d = ["--patches-dir", str(series.directory)]
    assert main(["patch", "import", *d, "--repo", str(clone), "--base", atom.c2]) == 0
    assert capsys.readouterr().out.startswith(f"patch-queue/{atom.c2[:7]} ")
    out = tmp_path / "out"
    assert main(["patch", "export", "--patches-dir", str(out), "--repo", str(clone), "--from", atom.c2]) == 0
    assert (out / series.patches[0].name).read_bytes() == series.patches[0].path.read_bytes()
    assert (clone / MODEL).read_text() == FIXED_FILE and OLD_FILE != FIXED_FILE
    # one more commit, appended as the next patch with headers from the flags
    (clone / "README.md").write_text("ATOM\n\nMiniMax-M3 recipe, patched.\n")
    git(clone, "commit", "-q", "-a", "-m", "docs: mention the patch")
    args = [
        "--repo",
        str(clone),
        "--from",
        atom.c2,
        "--aiter-requires",
        "fused_qknorm_idxrqknorm has kv_cache_v",
    ]
    assert main(["patch", "new", "--patches-dir", str(out), *args]) == 0
    assert capsys.readouterr().out.strip().endswith("0002-docs-mention-the-patch.patch")
    p2 = PatchSeries.load(out).patches[1]
    assert [str(r) for r in p2.aiter_requires] == ["fused_qknorm_idxrqknorm has kv_cache_v"]


def test_fixture_is_what_the_tests_think(atom: AtomFixture) -> None:
    """Guard: the fixture's commits hold the files the scenarios rely on."""

    def show(rev: str) -> str:
        return git(atom.mirror, "show", f"{rev}:{MODEL}") + "\n"

    assert show(atom.c2) == OLD_FILE and show(atom.c3) == FIXED_FILE and show(atom.c4) != OLD_FILE


# -- what git applies is what we validated (issue 26 §2) ---------------------------------

HARMLESS = (
    "diff --git a/docs/harmless.txt b/docs/harmless.txt\n"
    "new file mode 100644\n"
    "--- /dev/null\n"
    "+++ b/docs/harmless.txt\n"
    "@@ -0,0 +1 @@\n"
    "+harmless\n"
)
SIGNATURE = "-- \n2.43.0\n\n"
HIDDEN = {
    "python": (
        "diff --git a/atom/hidden_payload.py b/atom/hidden_payload.py\n"
        "new file mode 100644\n"
        "--- /dev/null\n"
        "+++ b/atom/hidden_payload.py\n"
        "@@ -0,0 +1 @@\n"
        "+import os; os.system('id')\n"
    ),
    "symlink": (
        "diff --git a/escape b/escape\n"
        "new file mode 120000\n"
        "--- /dev/null\n"
        "+++ b/escape\n"
        "@@ -0,0 +1 @@\n"
        "+/etc\n"
        "\\ No newline at end of file\n"
    ),
    "binary": (
        "diff --git a/atom/blob.bin b/atom/blob.bin\n"
        "new file mode 100644\n"
        "index 0000000000000000000000000000000000000000..4a2e7f1c11b0a9a3e8e2c7d5d4d1b0f6a0c3e9b1\n"
        "GIT binary patch\n"
        "literal 5\n"
        "McmZ?wbYf(H000mG0RR91\n"
        "\n"
        "literal 0\n"
        "HcmV?d00001\n"
    ),
}


def _cli_patch(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path, directory: Path, verb: str
) -> list[str]:
    lock = tmp_path / "locks" / "M.toml"
    if not lock.exists():
        _lock(lock, atom, aiter, atom.c2)
    args = ["patch", verb, "--patches-dir", str(directory), "--lock", str(lock)]
    args += ["--atom-repo", str(atom.mirror), "--aiter-repo", str(aiter.repo)]
    return args + (["--workdir", str(tmp_path / "w")] if verb == "apply" else [])


@pytest.mark.parametrize("kind", sorted(HIDDEN))
def test_a_diff_after_the_signature_is_refused_and_nothing_is_applied(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = patch_text(atom_range=f"{atom.c1[:10]}..", diff=HARMLESS + SIGNATURE + HIDDEN[kind])
    d = write_series(tmp_path / "p", {"0001-harmless.patch": text})
    before = _state(atom.mirror)
    for verb in ("check", "apply"):
        assert main(_cli_patch(atom, aiter, tmp_path, d, verb)) == ExitCode.PATCH
        err = capsys.readouterr().err
        assert "0001-harmless.patch:" in err and "after the signature line" in err and "refused" in err
    assert _state(atom.mirror) == before
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())
    assert [p.status for p in Lock.load(tmp_path / "locks" / "M.toml").patches] == []


def test_a_signature_alone_still_applies(atom: AtomFixture, aiter: AiterFixture, tmp_path: Path) -> None:
    """The guard: format-patch's own signature (git version, blank line) is no reason to refuse."""
    text = patch_text(atom_range=f"{atom.c1[:10]}..", diff=HARMLESS + SIGNATURE)
    series = PatchSeries.load(write_series(tmp_path / "p", {"0001-harmless.patch": text}))
    (c,) = check_series(series, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1)
    assert c.status == "applies", c.line()


def test_a_diff_git_would_read_where_we_do_not_is_refused_by_gits_own_view(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A traditional diff in the diffstat area: our parser skips it, `git apply` applies it. The
    validator compares our parse with `git apply --numstat --summary` of the exact bytes."""
    hidden = "--- /dev/null\n+++ b/atom/hidden_payload.py\n@@ -0,0 +1 @@\n+import os\n"
    text = patch_text(atom_range=f"{atom.c1[:10]}..", diff=hidden + HARMLESS)
    series = PatchSeries.load(write_series(tmp_path / "p", {"0001-harmless.patch": text}))
    assert series.patches[0].paths == ("docs/harmless.txt",)  # what our parse reads
    before = _state(atom.mirror)
    with pytest.raises(
        PatchError, match=r"git would apply files the patch does not show: atom/hidden_payload\.py"
    ):
        check_series(series, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1)
    assert main(_cli_patch(atom, aiter, tmp_path, series.directory, "apply")) == ExitCode.PATCH
    assert "atom/hidden_payload.py" in capsys.readouterr().err
    assert _state(atom.mirror) == before


def test_git_applies_the_bytes_that_were_validated_not_the_file_rewritten_since(
    atom: AtomFixture, aiter: AiterFixture, tmp_path: Path
) -> None:
    text = patch_text(atom_range=f"{atom.c1[:10]}..", diff=HARMLESS)
    d = write_series(tmp_path / "p", {"0001-harmless.patch": text})
    series = PatchSeries.load(d)
    swapped = HARMLESS.replace("docs/harmless.txt", "atom/hidden_payload.py")
    (d / "0001-harmless.patch").write_text(patch_text(atom_range=f"{atom.c1[:10]}..", diff=swapped))
    res = apply_series(
        series, GitRepo(atom.mirror), atom.c2, GitRepo(aiter.repo), aiter.a1, workdir=tmp_path / "w"
    )
    files = git(atom.mirror, "diff", "--name-only", atom.c2, res.head_sha).split()
    assert files == ["docs/harmless.txt"]


@pytest.mark.parametrize("which", ["series", "0001-harmless.patch"])
def test_a_symlinked_series_or_patch_file_is_refused(tmp_path: Path, which: str) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    d = write_series(
        tmp_path / "p", {"0001-harmless.patch": patch_text(atom_range="abcdef1..", diff=HARMLESS)}
    )
    (d / which).rename(real / which)
    (d / which).symlink_to(real / which)
    with pytest.raises(PatchError, match="is a symbolic link; refused") as e:
        PatchSeries.load(d)
    assert e.value.exit_code == ExitCode.PATCH


def test_import_refuses_what_git_would_apply_beyond_the_patch(atom: AtomFixture, tmp_path: Path) -> None:
    hidden = "--- /dev/null\n+++ b/atom/hidden_payload.py\n@@ -0,0 +1 @@\n+import os\n"
    text = patch_text(atom_range=f"{atom.c1[:10]}..", diff=hidden + HARMLESS)
    series = PatchSeries.load(write_series(tmp_path / "p", {"0001-harmless.patch": text}))
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(atom.mirror), str(clone))
    before = _state(clone)
    with pytest.raises(PatchError, match=r"files the patch does not show: atom/hidden_payload\.py"):
        import_series(series, GitRepo(clone), atom.c2)
    assert _state(clone) == before
    assert not (clone / "atom" / "hidden_payload.py").exists()
