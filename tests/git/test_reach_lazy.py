"""Reach reads each file only as far as the closure asks: the walk's files in full, the others
for their references only (who imports a file off the path). The result must not depend on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.compat.pysource import SummaryCache
from pipeline.compat.reach import SUMMARY_SCHEMA, ModelFacts, Reach, compute_reach
from pipeline.errors import SourceError
from pipeline.gitw import GitRepo
from tests.fixtures.gitfixture import commit_all, write_files
from tests.fixtures.reach_repos import ReachRepos, build_reach_repos

LEAF = "atom/model_ops/extra/leaf.py"
HELPER = "atom/model_ops/extra/helper.py"
ARCHS = ("GammaForCausalLM", "AlphaForCausalLM", "BetaForCausalLM", "DeepseekV4ForCausalLM")

# A second commit: an off-path package whose module imports its sibling relatively, inside a
# function, under an `if` (its blocks are never read, its importer is still found), and Gamma
# now importing broken.py (unchanged since the first commit) inside a function.
EXTRA = {
    "atom/model_ops/extra/__init__.py": "",
    HELPER: "def pick(flag):\n    if flag:\n        from .leaf import LEAF\n\n        return LEAF\n",
    LEAF: 'LEAF = "leaf"\n',
    "atom/models/gamma.py": (
        "from atom.model_ops.attn import Backend\n"
        "from atom.utils import resolve_obj_by_qualname\n\n"
        'KERNEL_PACKAGE = "atom.kernels."\n\n\n'
        "class GammaForCausalLM:\n"
        "    backend = Backend\n\n"
        "    def run(self, x):\n"
        "        from atom.model_ops.broken import run\n\n"
        "        return run(x, x, x)\n"
    ),
}


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReachRepos, str]:
    repos = build_reach_repos(tmp_path_factory.mktemp("reach-lazy"))
    write_files(repos.atom, EXTRA)
    second = commit_all(
        repos.atom, "an off-path package; Gamma calls broken.run", "2026-01-20T00:00:00+00:00"
    )
    return repos, second


def _reach(fx: tuple[ReachRepos, str], sha: str, arch: str, cache: Path) -> Reach:
    return compute_reach(GitRepo(fx[0].atom), sha, ModelFacts(arch), cache_dir=cache)


def _everything(r: Reach) -> dict[str, object]:
    """All a Reach says: its JSON, chains, exclusions, importers and every file's evidence."""
    return {
        "json": r.to_json(),
        "parents": r.parents,
        "excluded": r.excluded,
        "importers": r.importers,
        "conditional": r.conditional,
        "summary": r.edges_summary(),
        "evidence": {p: r.evidence(p) for p in sorted(r.files)},
        "conditions": {p: r.conditions(p) for p in sorted(r.files)},
    }


def _per_file_cache(cache: Path) -> dict[str, object]:
    return dict(SummaryCache.open(f"reach-files-v{SUMMARY_SCHEMA}", cache).data)


def test_files_off_the_path_are_read_for_their_references_only(
    fx: tuple[ReachRepos, str], tmp_path: Path
) -> None:
    repos, second = fx
    r = _reach(fx, second, "AlphaForCausalLM", tmp_path)
    assert not r.on_path(LEAF) and not r.on_path(HELPER)
    # The importer of an off-path file is found though its own blocks were never read.
    assert r.evidence(LEAF) == (
        f"{LEAF} is imported only by {HELPER}:3 (itself off the path): none is on AlphaForCausalLM's path"
    )
    # Its relative import also runs the package's __init__ (also off the path, found the same way).
    pkg = [(e.src, e.line, e.kind) for e in r.importers["atom/model_ops/extra/__init__.py"]]
    assert (HELPER, 3, "package") in pkg
    assert r.evidence(HELPER).startswith("nothing in ATOM ")
    blobs = GitRepo(repos.atom).blob_shas(second, prefix="atom", suffix=".py")
    kinds = {k.split(":", 1)[1] for k in _per_file_cache(tmp_path)}
    for path in blobs:
        if r.on_path(path):
            assert path in kinds and f"{path}:refs" not in kinds, path
        else:
            assert f"{path}:refs" in kinds and path not in kinds, path
    # The host entry point's file (atom/plugin/vllm/register.py) is off the path and read cheaply.
    assert "atom/plugin/vllm/register.py:refs" in kinds


@pytest.mark.parametrize("rev", ["first", "second"])
def test_the_result_does_not_depend_on_what_earlier_models_left_in_the_cache(
    fx: tuple[ReachRepos, str], tmp_path: Path, rev: str
) -> None:
    repos, second = fx
    sha = repos.atom_sha if rev == "first" else second
    shared = tmp_path / "shared"
    if rev == "second":  # the per-file cache of the first commit, where broken.py was off Gamma's path
        _reach(fx, repos.atom_sha, "GammaForCausalLM", shared)
    for arch in ARCHS:  # each model reaches files the ones before it read for references only
        warm = _reach(fx, sha, arch, shared)
        cold = _reach(fx, sha, arch, tmp_path / f"cold-{arch}")
        assert _everything(warm) == _everything(cold), arch
    gamma = _reach(fx, sha, "GammaForCausalLM", tmp_path / "cold-again")
    assert gamma.on_path("atom/model_ops/broken.py") == (rev == "second")


def test_a_blob_missing_from_the_repository_is_a_source_error(tmp_path: Path) -> None:
    # The stream is read by a thread: its error must surface in the caller, as the tool's own.
    repos = build_reach_repos(tmp_path / "repos")
    sha = GitRepo(repos.atom).blob_shas(repos.atom_sha, prefix="atom/models", suffix=".py")[
        "atom/models/alpha.py"
    ]
    (repos.atom / ".git" / "objects" / sha[:2] / sha[2:]).unlink()
    with pytest.raises(SourceError, match=f"object {sha} is missing from"):
        compute_reach(
            GitRepo(repos.atom), repos.atom_sha, ModelFacts("GammaForCausalLM"), cache_dir=tmp_path / "c"
        )
