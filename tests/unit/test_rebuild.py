"""`pipeline rebuild`'s reporting: obsolete patches, exit code, the CI summary."""

import contextlib
import io
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.errors import ExitCode, UsageError
from pipeline.rebuild import ModelOutcome, Plan, _verdict, overall_exit, summary_markdown
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


def _workflow() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    wf: dict[str, Any] = yaml.safe_load((root / ".github/workflows/rebuild.yml").read_text())
    return wf


def test_the_workflow_matrix_is_the_recipes_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parents[2]
    (step,) = [s for s in _workflow()["jobs"]["pins"]["steps"] if s.get("id") == "list"]
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


def test_the_matrix_is_the_pin_jobs_plan_and_every_model_job_builds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = _workflow()["jobs"]
    pins, model_job = jobs["pins"], jobs["rebuild"]
    # The matrix is what the pin job planned, and nothing runs before the plan exists.
    assert model_job["needs"] == "pins"
    assert model_job["strategy"]["matrix"]["model"] == "${{ fromJSON(needs.pins.outputs.models) }}"
    assert pins["outputs"]["models"] == "${{ steps.plan.outputs.models }}"
    (plan_step,) = [s for s in pins["steps"] if s.get("id") == "plan"]
    assert "pipeline rebuild --write-plan pins $args" in plan_step["run"]
    assert plan_step["env"]["MODELS"] == "${{ steps.list.outputs.models }}"
    # The plan step's own output code, run on a plan as `rebuild --write-plan` writes it.
    code = plan_step["run"].split("<<'PY' >> \"$GITHUB_OUTPUT\"\n", 1)[1].split("\nPY", 1)[0]
    plan = Plan("a" * 40, "b" * 40, {"Zeta": {"status": "ok"}, "Alpha": {"status": "incompatible"}})
    (tmp_path / "pins").mkdir()
    (tmp_path / "pins" / "plan.json").write_text(json.dumps(plan.to_json()))
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(textwrap.dedent(code), {})
    lines = dict(line.split("=", 1) for line in out.getvalue().splitlines())
    assert json.loads(lines["models"]) == ["Alpha", "Zeta"]  # every planned model gets a job
    assert (lines["atom"], lines["aiter"]) == ("a" * 40, "b" * 40)
    # The plan goes up once and comes down in every model job, which builds from it alone.
    (upload,) = [s for s in pins["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    (download,) = [
        s for s in model_job["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact")
    ]
    assert upload["with"]["path"].rstrip("/") == "pins" and download["with"]["path"] == "pins"
    assert upload["with"]["name"] == download["with"]["name"] == "pins-${{ github.run_id }}"
    (run,) = [s for s in model_job["steps"] if s.get("id") == "rebuild"]
    assert run["run"].endswith("--plan pins/plan.json")
    assert "--atom" not in run["run"] and "--aiter" not in run["run"]
    assert not {"PIPELINE_ATOM_REF", "PIPELINE_AITER_REF"} & set(model_job["env"])  # no pin of its own


def test_the_plan_builds_each_inputs_digest_once_and_leads_each_aiter_stage_once(tmp_path: Path) -> None:
    d1, d2, d3, d4 = ("1" * 64, "2" * 64, "3" * 64, "4" * 64)
    ok = {"status": "ok", "released": False}
    plan = Plan(
        "a" * 40, "b" * 40,
        {
            "A": {**ok, "inputs_digest": d1, "aiter_stage": "k1"},
            "B": {**ok, "inputs_digest": d1, "aiter_stage": "k1"},  # same image as A
            "C": {**ok, "inputs_digest": d2, "aiter_stage": "k1"},
            "D": {**ok, "inputs_digest": d3, "aiter_stage": "k2"},
            "E": {**ok, "inputs_digest": d4, "aiter_stage": "k1", "released": True},
            "F": {"status": "incompatible", "notes": ["aiter x breaks it"]},
        },
    )  # fmt: skip
    assert [(b["models"], b["aiter_stage"], b["lead"]) for b in plan.builds()] == [
        (["A", "B"], "k1", True),
        (["C"], "k1", False),
        (["D"], "k2", True),
    ]
    assert plan.matrix() == {
        "lead": [d1, d3],
        "follow": [d2],
        "smoke": ["A", "B", "C", "D"],
        "left_out": ["F"],
        "released": ["E"],
    }
    assert plan.build_of(d2)["models"] == ["C"]
    with pytest.raises(UsageError, match="has no build with inputs digest '4444"):
        plan.build_of(d4)  # released: nothing to build
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    assert json.loads((tmp_path / "plan.json").read_text())["matrix"] == plan.matrix()
    assert Plan.load(tmp_path / "plan.json").builds() == plan.builds()
