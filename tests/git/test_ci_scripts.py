"""scripts/ci/report.sh, the workflow's final job: red when a model was left out or a job failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


# -- the plan job's judgement of `rebuild --write-plan` (scripts/ci/common.sh write_plan) --

from tests.fixtures.reach_repos import ReachRepos, build_reach_repos  # noqa: E402
from tests.git import test_rebuild_plan  # noqa: E402


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> ReachRepos:
    return build_reach_repos(tmp_path_factory.mktemp("plan"))


def _write_plan(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """write_plan as plan.sh calls it, with this checkout's real `pipeline` on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / "pipeline"
    tool.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m pipeline "$@"\n')
    tool.chmod(0o755)
    run_env = {
        **{k: v for k, v in os.environ.items() if k.startswith("PIPELINE_")},
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
        "PLAN_DIR": str(tmp_path / "plan"), "HOME": os.environ.get("HOME", "/root"), **env,
    }  # fmt: skip
    script = f'. {ROOT}/scripts/ci/common.sh && write_plan "$@" && echo "planned: exit 0 for this job"'
    return subprocess.run(
        ["bash", "-c", script, "write_plan", *args],
        env=run_env, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip


def test_the_plan_job_passes_a_plan_that_leaves_models_out_and_fails_anything_else(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    test_rebuild_plan._env(fx, tmp_path, monkeypatch)
    (tmp_path / "recipes" / "Broken.yaml").write_text("name: [not a recipe\n")
    # the documented outcome: Broken left out (exit 2), the plan written whole: the job goes on
    got = _write_plan(tmp_path / "a")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "planned: exit 0" in got.stdout and "some models were left out (exit 2)" in got.stderr
    # a crash after the plan was written (here: the step summary cannot be written): its exit is
    # not the one the plan's left-out models give, so the job fails
    (tmp_path / "summary-is-a-directory").mkdir()
    got = _write_plan(tmp_path / "b", GITHUB_STEP_SUMMARY=str(tmp_path / "summary-is-a-directory"))
    assert (tmp_path / "b" / "plan" / "plan.json").is_file()
    assert got.returncode == 1 and "planned:" not in got.stdout, got.stdout + got.stderr
    assert "::error::rebuild --write-plan failed (exit " in got.stderr
    assert "the plan it wrote leaves out models for exit 2" in got.stderr
    # a tool that fails before planning, with a plan left in PLAN_DIR from an earlier run
    stale = tmp_path / "a" / "plan" / "plan.json"
    assert stale.is_file()
    got = _write_plan(tmp_path / "a", "--model=Nobody")
    assert got.returncode == 1 and "planned:" not in got.stdout, got.stdout + got.stderr
    assert "::error::rebuild --write-plan wrote no plan" in got.stderr


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("REQUESTED_MODELS", "not json", "REQUESTED_MODELS is not a JSON list of model names: not json"),
        ("REQUESTED_MODELS", '["a b"]', "REQUESTED_MODELS is not a JSON list of model names"),
        ("REQUESTED_MODELS", '{"A": 1}', "REQUESTED_MODELS is not a JSON list of model names"),
        ("GPU_HOSTS", "0", "GPU_HOSTS (vars.MI355_RUNNERS) must be a number of hosts, 1 or more: 0"),
    ],
)
def test_the_plan_job_refuses_an_input_it_cannot_read_before_installing_anything(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    """A models list that cannot be read must not become "every model" (it did: the list was read
    through a process substitution whose failure nothing saw)."""
    env = {
        "PATH": os.environ["PATH"], "PYTHON": sys.executable, "HOME": os.environ.get("HOME", "/root"),
        "VENV": str(tmp_path / "venv"), "PLAN_DIR": str(tmp_path / "plan"), variable: value,
    }  # fmt: skip
    plan_sh = str(ROOT / "scripts/ci/plan.sh")
    got = subprocess.run(["bash", plan_sh], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert got.returncode == 1 and f"::error::{said}" in got.stderr, got.stdout + got.stderr
    assert not (tmp_path / "venv").exists() and not (tmp_path / "plan").exists()  # nothing done
