"""`pipeline rebuild`'s reporting: obsolete patches, exit code, the CI summary."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from pipeline.errors import ExitCode
from pipeline.rebuild import ModelOutcome, _verdict, overall_exit, summary_markdown
from pipeline.stages import check


def test_exit_code_is_the_worst_but_no_gpus_only_when_nothing_else_failed() -> None:
    ok = ModelOutcome("A", "released", 0)
    no_gpu = ModelOutcome("B", "stopped", int(ExitCode.NO_HARDWARE))
    broken = ModelOutcome("C", "failed", int(ExitCode.INCOMPATIBLE))
    assert overall_exit([ok]) == 0
    assert overall_exit([ok, no_gpu]) == ExitCode.NO_HARDWARE
    assert overall_exit([ok, no_gpu, broken]) == ExitCode.INCOMPATIBLE


def test_summary_table_names_each_model_and_its_first_note_line() -> None:
    md = summary_markdown(
        [
            ModelOutcome("MiniMax-M3-MXFP4", "unchanged", 0, atom="a" * 40, aiter="b" * 40, tag="r:t"),
            ModelOutcome("MiniMax-M3-MXFP8", "failed", 4, notes=["ATOM x calls aiter y wrongly\ndetails"]),
        ]
    )
    assert "| MiniMax-M3-MXFP4 | ⏸ unchanged (exit 0) | aaaaaaaaa | bbbbbbbbbb |" in md
    assert "| r:t |" in md
    assert "❌ failed (exit 4)" in md and "ATOM x calls aiter y wrongly" in md and "details" not in md


def test_summary_row_per_model_has_verdict_image_smoke_and_drift() -> None:
    row = ModelOutcome(
        "M", "stopped", int(ExitCode.NO_HARDWARE), atom="a" * 40, aiter="b" * 40,
        verdict="compatible (2 break(s) off X's path, warned)", image="repo:candidate-123",
        smoke="not run here (no MI355)", drift="server changed by ATOM c101aa0a89",
    )  # fmt: skip
    md = summary_markdown([row])
    header = md.splitlines()[2]
    assert header.split(" | ")[4:8] == ["verdict (its path)", "image", "smoke", "recipe drift"]
    assert (
        "| compatible (2 break(s) off X's path, warned) | repo:candidate-123 | not run here (no MI355) | "
        "server changed by ATOM c101aa0a89 |"
    ) in md


def test_the_workflow_matrix_is_the_recipes_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parents[2]
    wf = yaml.safe_load((root / ".github/workflows/rebuild.yml").read_text())
    matrix = wf["jobs"]["rebuild"]["strategy"]["matrix"]["model"]
    assert matrix == "${{ fromJSON(needs.recipes.outputs.models) }}"
    (step,) = [s for s in wf["jobs"]["recipes"]["steps"] if s.get("id") == "list"]
    one_liner = step["run"].split("python3 -c '", 1)[1].split("')", 1)[0]
    monkeypatch.chdir(root)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(one_liner, {})  # the job's own listing, run here
    assert json.loads(out.getvalue()) == sorted(p.stem for p in (root / "recipes").glob("*.yaml"))
    assert "MiniMax-M3-MXFP4" in json.loads(out.getvalue())


def test_the_verdict_column_says_what_the_gate_excused_as_the_check_counts_it() -> None:
    out = check.Outputs(
        atom_sha="a" * 40, aiter_sha="b" * 40, errors=0, warnings=4, waived=2, checked=9, unchecked=0,
        off_path=1, architecture="X",
    )  # fmt: skip
    assert _verdict(out) == "compatible (1 break(s) off X's path, warned; 2 waived by the recipe)"
    assert "(1 off the model's path, 2 waived by the recipe)" in out.figure()
