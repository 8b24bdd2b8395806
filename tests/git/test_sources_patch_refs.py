"""The tool's own refs survive the mirror's pruning fetch: pin → patch apply → pin → patch apply.

The mirror fetches `+refs/heads/*:refs/heads/*` with `--prune`; a patched
branch kept under refs/heads/ was deleted by the next `pin`, and the next
`patch apply` then saw every file of the work tree as a local change (exit 5).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from tests.fixtures.build_repos import MODEL, BuildRepos, run_git


def atom_mirror(tmp_path: Path) -> Path:
    [mirror] = [p for p in (tmp_path / "cache" / "mirrors").glob("*ATOM*.git") if p.is_dir()]
    return mirror


def test_pin_apply_pin_apply(world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pin", "--model", MODEL]) == 0
    assert main(["patch", "apply", "--model", MODEL]) == 0
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said.startswith("patched ATOM: ")  # the SHA is labelled
    first = said.split()[2]
    assert first == world.patched_sha or len(first) == 40

    # upstream moves on: the next pin fetches (and prunes) the ATOM mirror
    run_git(world.atom, "commit", "-q", "--allow-empty", "-m", "upstream moves on")
    assert main(["pin", "--model", MODEL, "--atom", world.atom_sha]) == 0
    capsys.readouterr()
    assert main(["patch", "apply", "--model", MODEL]) == 0
    out, err = capsys.readouterr()
    assert out.strip().splitlines()[-1].split()[2] == first  # same inputs, same patched commit
    assert "local changes" not in err

    mirror = atom_mirror(tmp_path)
    refs = run_git(mirror, "for-each-ref", "--format=%(refname)").splitlines()
    patched = [r for r in refs if r.startswith("refs/pipeline/patched/")]
    assert len(patched) == 1 and not any(r.startswith("refs/heads/pipeline/") for r in refs)
    assert run_git(mirror, "rev-parse", patched[0]) == first


def test_work_tree_left_on_a_pruned_branch_is_recovered(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache from an older version: the work tree sits on refs/heads/pipeline/patched/X."""
    assert main(["pin", "--model", MODEL]) == 0
    assert main(["patch", "apply", "--model", MODEL]) == 0
    [wt] = (tmp_path / "cache" / "patched").iterdir()
    run_git(wt, "checkout", "-q", "-B", "pipeline/patched/old-layout")
    run_git(world.atom, "commit", "-q", "--allow-empty", "-m", "upstream moves on")
    assert main(["pin", "--model", MODEL, "--atom", world.atom_sha]) == 0  # prunes that branch
    assert run_git(atom_mirror(tmp_path), "for-each-ref", "refs/heads/pipeline") == ""
    capsys.readouterr()

    assert main(["patch", "apply", "--model", MODEL]) == 0
    assert "local changes" not in capsys.readouterr().err


def test_real_local_changes_are_refused_with_advice_that_works(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pin", "--model", MODEL]) == 0
    assert main(["patch", "apply", "--model", MODEL]) == 0
    [wt] = (tmp_path / "cache" / "patched").iterdir()
    (wt / "atom" / "models" / "minimax_m3.py").write_text("# edited by hand\n")
    capsys.readouterr()

    assert main(["patch", "apply", "--model", MODEL]) == ExitCode.PATCH
    err = capsys.readouterr().err
    assert "local changes (1 path: atom/models/minimax_m3.py)" in err
    assert f"pipeline patch new --repo {wt}" in err and "worktree remove --force" in err
