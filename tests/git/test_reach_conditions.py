"""A module on a model's path only under `if` blocks: reach names the conditions, the finding stays
an error, and only a waiver naming every condition holds (until an unconditional way in appears)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.compat import run_check
from pipeline.compat.reach import ModelFacts, compute_reach, gate_model
from pipeline.errors import ExitCode, SourceError
from pipeline.gitw import GitRepo
from pipeline.recipes.recipe import parse_recipe
from tests.fixtures.gitfixture import commit_all, dedented, write_files
from tests.fixtures.reach_repos import BROKEN_CALL, ReachRepos, build_reach_repos, recipe_yaml

TRITON = "atom/model_ops/triton_moe.py"
METHOD = "atom/model_ops/moe_method.py"

# The shape of ATOM's moe.py: the Triton MoE module is imported inside methods, under flags.
DELTA = {
    "atom/models/delta.py": """
        from atom.model_ops.moe_method import MoeMethod


        class DeltaForCausalLM:
            method = MoeMethod
    """,
    METHOD: """
        class MoeMethod:
            def __init__(self, gfx):
                self.use_triton = gfx.startswith("gfx94")
                self.use_triton_decode = False

            def forward(self, x, prefill):
                if self.use_triton_decode and not prefill:
                    from atom.model_ops.triton_moe import (
                        run,
                    )

                    return run(x, x, x)
                if self.use_triton:  # gfx94x only by default
                    from atom.model_ops.triton_moe import run

                    return run(x, x, x)
                return x
    """,
    TRITON: f"""
        import aiter


        def run(x, y, z):
            return {BROKEN_CALL}
    """,
}


def _with_delta(src: Path, dst: Path) -> str:
    shutil.copytree(src, dst)
    files = dedented(DELTA)
    runner = (dst / "atom/model_engine/model_runner.py").read_text()
    files["atom/model_engine/model_runner.py"] = runner.replace(
        '    "AlphaForCausalLM":',
        '    "DeltaForCausalLM": "atom.models.delta.DeltaForCausalLM",\n    "AlphaForCausalLM":',
    )
    write_files(dst, files)
    return commit_all(dst, "Delta: Triton MoE under flags", "2026-01-16T00:00:00+00:00")


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReachRepos, str]:
    base = build_reach_repos(tmp_path_factory.mktemp("reachcond"))
    sha = _with_delta(base.atom, base.atom.parent / "atom-delta")
    return ReachRepos(base.atom.parent / "atom-delta", base.aiter, sha, base.aiter_sha), sha


def _clone(repos: ReachRepos, tmp_path: Path, files: dict[str, str | None], message: str) -> tuple[Path, str]:
    """The Delta tree with `files` changed, committed as the next ATOM commit."""
    clone = tmp_path / "atom"
    shutil.copytree(repos.atom, clone)
    write_files(clone, files)
    return clone, commit_all(clone, message, "2026-01-17T00:00:00+00:00")


def _waiver_recipe(when: list[str] | None) -> str:
    text = recipe_yaml("Delta", "DeltaForCausalLM")
    text += f"""compat:
  waive:
    - path: {TRITON}
      function: aiter.op
      reason: "reviewed: the Triton MoE path is off by default on gfx950"
"""
    if when is not None:
        text += "      when: [" + ", ".join(json.dumps(w) for w in when) + "]\n"
    return text


def test_reach_names_the_conditions_on_the_path(fx: tuple[ReachRepos, str]) -> None:
    repos, sha = fx
    r = compute_reach(GitRepo(repos.atom), sha, ModelFacts("DeltaForCausalLM"))
    assert r.on_path(TRITON) and r.on_path(METHOD)
    assert TRITON in r.conditional and METHOD not in r.conditional
    assert r.conditions(TRITON) == (("if self.use_triton_decode and not prefill",), ("if self.use_triton",))
    assert r.evidence(TRITON).startswith(
        "DeltaForCausalLM reaches atom/model_ops/triton_moe.py only under "
        "`if self.use_triton_decode and not prefill` (moe_method.py:7), import at moe_method.py:8; "
        "`if self.use_triton` (moe_method.py:13), import at moe_method.py:14: atom/models/delta.py -> "
    )
    assert r.to_json()["files_only_under_conditions"] == 1


def test_a_conditional_break_stays_an_error(fx: tuple[ReachRepos, str]) -> None:
    repos, sha = fx
    report = run_check(GitRepo(repos.atom), sha, GitRepo(repos.aiter), repos.aiter_sha)
    gate = gate_model(report, GitRepo(repos.atom), parse_recipe(recipe_yaml("Delta", "DeltaForCausalLM")))
    (err,) = [f for f in gate.report.errors if f.path == TRITON]
    assert err.reach == "on-path" and "only under `if self.use_triton" in err.reach_evidence
    assert err.to_json()["reach_conditions"] == [
        ["if self.use_triton_decode and not prefill"],
        ["if self.use_triton"],
    ]
    assert not gate.report.ok


def test_a_waiver_must_name_every_condition(fx: tuple[ReachRepos, str]) -> None:
    repos, sha = fx
    report = run_check(GitRepo(repos.atom), sha, GitRepo(repos.aiter), repos.aiter_sha)
    atom = GitRepo(repos.atom)
    # One of the two ways in is not named: the error gates, and the note says why.
    gate = gate_model(report, atom, parse_recipe(_waiver_recipe(["if self.use_triton"])))
    assert gate.waived == 0 and any(f.path == TRITON for f in gate.report.errors)
    (note,) = gate.notes
    assert note.status == "condition-not-met"
    assert "also under if self.use_triton_decode and not prefill" in note.message
    # Both named (a named condition covers a conjunction it starts): waived, a warning with the reason.
    gate = gate_model(
        report, atom, parse_recipe(_waiver_recipe(["self.use_triton", "self.use_triton_decode"]))
    )
    assert gate.waived == 1 and gate.notes == ()
    assert not any(f.path == TRITON for f in gate.report.errors)
    # A waiver without `when` is the reviewed exception it always was.
    gate = gate_model(report, atom, parse_recipe(_waiver_recipe(None)))
    assert gate.waived == 1


def test_an_unconditional_way_in_voids_the_conditional_waiver(
    fx: tuple[ReachRepos, str], tmp_path: Path
) -> None:
    repos, _ = fx
    text = (repos.atom / METHOD).read_text()
    text += "\n\ndef warm_up():\n    from atom.model_ops.triton_moe import run\n\n    return run\n"
    clone, sha = _clone(repos, tmp_path, {METHOD: text}, "warm-up imports the Triton MoE unconditionally")
    r = compute_reach(GitRepo(clone), sha, ModelFacts("DeltaForCausalLM"))
    assert TRITON not in r.conditional and r.conditions(TRITON) == ()
    assert "only under" not in r.evidence(TRITON)
    report = run_check(GitRepo(clone), sha, GitRepo(repos.aiter), repos.aiter_sha)
    gate = gate_model(
        report, GitRepo(clone), parse_recipe(_waiver_recipe(["self.use_triton", "self.use_triton_decode"]))
    )
    assert gate.waived == 0 and not gate.report.ok
    (note,) = gate.notes
    assert note.status == "condition-not-met" and "reaches the call unconditionally" in note.message


def test_check_text_shows_the_condition(
    fx: tuple[ReachRepos, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repos, sha = fx
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "Delta.yaml").write_text(recipe_yaml("Delta", "DeltaForCausalLM"))
    monkeypatch.setenv("PIPELINE_RECIPES_DIR", str(recipes))
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "check.txt"
    args = ["check", "--atom-repo", str(repos.atom), "--aiter-repo", str(repos.aiter)]
    args += ["--atom", sha, "--aiter", repos.aiter_sha, "--model", "Delta", "-o", str(out)]
    assert main(args) == ExitCode.INCOMPATIBLE
    text = out.read_text()
    assert f"{TRITON}:5:" in text and "error" in text
    assert (
        "reach: on-path: DeltaForCausalLM reaches atom/model_ops/triton_moe.py only under `if self.use_triton"
        in text
    )


def test_stream_blobs_reads_in_order_and_names_a_missing_object(fx: tuple[ReachRepos, str]) -> None:
    repos, sha = fx
    atom = GitRepo(repos.atom)
    blobs = atom.blob_shas(sha, prefix="atom", suffix=".py")
    shas = sorted(set(blobs.values()))
    assert dict(atom.stream_blobs(shas)) == atom.cat_blobs(shas)
    with pytest.raises(SourceError, match=r"object 0{40} is missing"):
        list(atom.stream_blobs([shas[0], "0" * 40]))


def test_a_file_reached_through_both_branches_of_an_if_is_unconditional(
    fx: tuple[ReachRepos, str], tmp_path: Path
) -> None:
    repos, _ = fx
    server = "atom/entrypoints/openai_server.py"
    files: dict[str, str | None] = {
        server: (
            "import os\n\nif os.environ.get('ALT_SERVER'):\n    from atom.entrypoints.alt import main\n"
            "else:\n    from atom.entrypoints.openai.api_server import main\n"
        ),
        "atom/entrypoints/alt.py": (
            "from atom.model_engine.model_runner import ModelRunner\n\n\ndef main():\n    ModelRunner()\n"
        ),
    }
    clone, sha = _clone(repos, tmp_path, files, "two servers, one chosen by the environment")
    r = compute_reach(GitRepo(clone), sha, ModelFacts("DeltaForCausalLM"))
    # Each server module only under its branch; what both of them import, either way.
    assert r.conditions("atom/entrypoints/alt.py") == (("if os.environ.get('ALT_SERVER')",),)
    assert r.conditions("atom/entrypoints/openai/api_server.py") == (
        ("else of if os.environ.get('ALT_SERVER')",),
    )
    runner = "atom/model_engine/model_runner.py"
    assert r.on_path(runner) and runner not in r.conditional and "only under" not in r.evidence(runner)
    assert r.conditions(TRITON) == (("if self.use_triton_decode and not prefill",), ("if self.use_triton",))
