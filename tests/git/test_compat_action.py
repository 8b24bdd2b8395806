"""The composite action (action.yml): its script run as the action runs it, on the compat fixture.

The action's steps around the script are GitHub's own (setup-python, cache, upload-sarif); what the
action adds is scripts/ci/compat-action.sh, run here with the variables action.yml gives it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.errors import ExitCode
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/ci/compat-action.sh"


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("action"))


def run_action(tmp: Path, repository: str, workspace: Path, **inputs: str) -> tuple[int, dict[str, str], str]:
    """The script with GitHub's variables and the INPUT_* action.yml sets; (exit, outputs, summary)."""
    out, summary = tmp / "github_output", tmp / "step_summary"
    out.write_text("")
    summary.write_text("")
    (tmp / "recipes").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "GITHUB_REPOSITORY": repository,
        "GITHUB_WORKSPACE": str(workspace),
        "GITHUB_OUTPUT": str(out),
        "GITHUB_STEP_SUMMARY": str(summary),
        "RUNNER_TEMP": str(tmp / "runner"),
        "INPUT_CACHE_DIR": str(tmp / "cache"),
        "PIPELINE_CMD": f"{sys.executable} -m pipeline",
        "PYTHONPATH": str(ROOT),
        "PIPELINE_RECIPES_DIR": str(tmp / "recipes"),  # no recipe: every break gates
        "PIPELINE_LOCKS_DIR": str(tmp / "locks"),
        **{f"INPUT_{k.upper()}": v for k, v in inputs.items()},
    }
    res = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=tmp, capture_output=True, text=True, timeout=600)
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return res.returncode, outputs, summary.read_text() + res.stderr


def test_action_metadata_maps_every_input_to_the_script() -> None:
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    declared = set(action["inputs"])
    used = set(re.findall(r"inputs\.([a-z-]+)", (ROOT / "action.yml").read_text()))
    assert used <= declared, used - declared
    (run,) = [s for s in action["runs"]["steps"] if s.get("id") == "run"]
    assert "scripts/ci/compat-action.sh" in run["run"]
    given = set(run["env"])
    read = set(re.findall(r"INPUT_[A-Z_]+", SCRIPT.read_text()))
    assert read - given == {"INPUT_OUTPUT_DIR"}  # (where the reports go: RUNNER_TEMP in the action)
    assert {f"INPUT_{n.upper().replace('-', '_')}" for n in declared} - given == {
        "INPUT_UPLOAD_SARIF", "INPUT_FAIL_ON_BREAK", "INPUT_PYTHON_VERSION",  # used by the other steps
    }  # fmt: skip


def test_the_readme_shows_each_example_workflow_as_linted() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in ("atom-pull-request.yml", "aiter-pull-request.yml"):
        assert "```yaml\n" + (ROOT / "docs/action" / name).read_text() + "```" in readme, name


def test_aiter_pull_request_runs_impact(fx: CompatRepos, tmp_path: Path) -> None:
    code, out, summary = run_action(
        tmp_path, "ROCm/aiter", fx.aiter,
        mode="auto", aiter_base=fx.a["A1c"], aiter_head=fx.a["A2"], atom_refs=fx.t["T1"],
        atom_repo=f"file://{fx.atom}",  # a URL: mirrored into the cache first
    )  # fmt: skip
    assert code == 0, summary
    assert (out["mode"], out["breaks"], out["exit-code"]) == ("impact", "true", "4")
    sarif = json.loads(Path(out["sarif"]).read_text())
    (res,) = sarif["runs"][0]["results"]
    assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "aiter/ops/fused.py"
    assert len(res["relatedLocations"]) == 3
    assert "### aiter change impact on ATOM" in summary and "**Breaks**: BREAKS: 3 ATOM call(s)" in summary
    assert (tmp_path / "cache/mirrors/atom.git").is_dir()
    # again: the mirror is fetched, not cloned, and the answer is the same
    code, again, _ = run_action(
        tmp_path, "ROCm/aiter", fx.aiter,
        aiter_base=fx.a["A1c"], aiter_head=fx.a["A2"], atom_refs=fx.t["T1"], atom_repo=f"file://{fx.atom}",
    )  # fmt: skip
    assert code == 0 and again["breaks"] == "true"


def test_atom_pull_request_runs_check(fx: CompatRepos, tmp_path: Path) -> None:
    code, out, summary = run_action(
        tmp_path, "ROCm/ATOM", fx.atom, atom_ref=fx.t["T2"], aiter_repo=str(fx.aiter), aiter_ref=fx.a["A4"]
    )
    assert code == 0, summary
    assert (out["mode"], out["breaks"], out["exit-code"]) == ("check", "false", "0")
    assert json.loads(Path(out["sarif"]).read_text())["version"] == "2.1.0"
    assert "### ATOM × aiter check" in summary and "No break: compatible" in summary
    code, out, summary = run_action(
        tmp_path, "ROCm/ATOM", fx.atom, atom_ref=fx.t["T1"], aiter_repo=str(fx.aiter), aiter_ref=fx.a["A2"]
    )
    assert code == 0 and out["breaks"] == "true" and "**Breaks**: INCOMPATIBLE" in summary


def test_a_failed_run_is_the_scripts_failure(fx: CompatRepos, tmp_path: Path) -> None:
    bad = {"aiter_base": "no-such-ref", "atom_refs": fx.t["T1"], "atom_repo": str(fx.atom)}
    code, out, text = run_action(tmp_path, "ROCm/aiter", fx.aiter, **bad)
    assert code == ExitCode.SOURCE and "breaks" not in out and "no verdict" in text
    code, _, text = run_action(tmp_path, "ROCm/ATOM", fx.atom, mode="both")
    assert code == 2 and "mode must be auto, check or impact" in text
