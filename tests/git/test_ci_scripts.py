"""scripts/ci/report.sh, the workflow's final job: red when a model was left out or a job failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline.rebuild import Plan

ROOT = Path(__file__).resolve().parents[2]


def _report(tmp_path: Path, plan: Plan | None, needs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir(parents=True, exist_ok=True)
    if plan is not None:
        (plan_dir / "plan.json").write_text(json.dumps(plan.to_json()))
    env = {
        "PATH": os.environ["PATH"], "PYTHON": sys.executable, "PLAN_DIR": str(plan_dir),
        "NEEDS": json.dumps({job: {"result": r, "outputs": {}} for job, r in needs.items()}),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }  # fmt: skip
    return subprocess.run(
        ["bash", str(ROOT / "scripts/ci/report.sh")], env=env, capture_output=True, text=True, check=False
    )


OK = {"status": "ok", "inputs_digest": "1" * 64, "aiter_stage": "k"}
ALL_GREEN = {
    "plan": "success",
    "build-lead": "success",
    "build": "skipped",
    "smoke": "success",
    "tag": "success",
}


def test_a_run_where_everything_went_through_is_green(tmp_path: Path) -> None:
    got = _report(tmp_path, Plan("a" * 40, "b" * 40, {"A": OK}), ALL_GREEN)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "every planned model went through" in (tmp_path / "summary.md").read_text()


def test_a_model_left_out_of_the_plan_makes_the_run_red_after_the_others_went_through(tmp_path: Path) -> None:
    plan = Plan("a" * 40, "b" * 40, {"A": OK, "B": {"status": "incompatible", "notes": ["x"]}})
    got = _report(tmp_path, plan, ALL_GREEN)
    assert got.returncode == 1 and "::error::B: left out (incompatible)" in got.stdout


def test_a_failed_job_or_no_plan_makes_the_run_red(tmp_path: Path) -> None:
    got = _report(tmp_path, Plan("a" * 40, "b" * 40, {"A": OK}), {**ALL_GREEN, "smoke": "failure"})
    assert got.returncode == 1 and "::error::job smoke: failure" in got.stdout
    got = _report(tmp_path / "none", None, {"plan": "failure"})
    assert got.returncode == 1 and "::error::no plan" in got.stdout
