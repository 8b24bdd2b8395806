"""`pipeline rebuild`'s reporting: obsolete patches, exit code, the CI summary."""

import json
import os
import re
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


def test_the_verdict_column_says_what_the_gate_excused_as_the_check_counts_it() -> None:
    out = check.Outputs(
        atom_sha="a" * 40, aiter_sha="b" * 40, errors=0, warnings=4, waived=2, checked=9, unchecked=0,
        off_path=1, architecture="X",
    )  # fmt: skip
    assert _verdict(out) == "compatible (1 break(s) off X's path, warned; 2 waived by the recipe)"
    assert "(1 off the model's path, 2 waived by the recipe)" in out.figure()


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


_SHA_PIN = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
_RUN = re.compile(r'^scripts/ci/([a-z]+)\.sh( "\$[A-Z]+")?$')


def test_every_step_of_the_workflow_is_a_job_script_or_an_action_pinned_by_sha() -> None:
    root = Path(__file__).resolve().parents[2]
    for name, job in _workflow()["jobs"].items():
        for step in job["steps"]:
            if "uses" in step:
                assert _SHA_PIN.match(step["uses"]), (name, step["uses"])
                continue
            m = _RUN.match(step["run"])
            assert m, (name, step["run"])  # thin YAML: the logic is in a script tests can run
            script = root / "scripts" / "ci" / f"{m.group(1)}.sh"
            assert script.is_file() and os.access(script, os.X_OK), script
            assert "${{" not in step["run"]  # values reach the script through env, never the command


def test_each_kind_of_job_runs_on_its_kind_of_machine_with_only_its_secrets() -> None:
    jobs = _workflow()["jobs"]
    assert set(jobs) == {"plan", "build-lead", "build", "smoke", "tag", "report"}
    hosted = ("ubuntu-latest",)
    assert jobs["plan"]["runs-on"] in hosted and jobs["report"]["runs-on"] in hosted  # no GPU, no build host
    assert jobs["build-lead"]["runs-on"] == jobs["build"]["runs-on"] == ["self-hosted", "linux", "build"]
    assert jobs["smoke"]["runs-on"] == ["self-hosted", "linux", "mi355"]
    assert jobs["smoke"]["strategy"]["max-parallel"] == "${{ fromJSON(vars.MI355_RUNNERS || '1') }}"
    assert jobs["tag"]["concurrency"] == {
        "group": "tag-${{ github.repository }}",
        "cancel-in-progress": False,
    }

    def secrets(job: dict[str, Any]) -> set[str]:
        text = yaml.safe_dump(job)
        return set(re.findall(r"secrets\.(\w+)", text))

    assert secrets(jobs["plan"]) == secrets(jobs["report"]) == set()
    assert secrets(jobs["build-lead"]) == secrets(jobs["build"]) == {"REGISTRY_USER", "REGISTRY_PASSWORD"}
    assert secrets(jobs["smoke"]) == {"HF_TOKEN"}
    assert secrets(jobs["tag"]) == {"REGISTRY_USER", "REGISTRY_PASSWORD"}
    # write permissions only where something is published
    assert _workflow()["permissions"] == {"contents": "read"}
    assert jobs["plan"]["permissions"]["security-events"] == "write"
    assert jobs["report"]["permissions"]["checks"] == "write"


def test_the_matrices_are_the_plans_and_the_followers_wait_for_the_leads() -> None:
    jobs = _workflow()["jobs"]
    plan_keys = set(Plan("a" * 40, "b" * 40, {}).matrix())
    assert set(jobs["plan"]["outputs"]) <= plan_keys
    assert jobs["build-lead"]["strategy"]["matrix"]["digest"] == "${{ fromJSON(needs.plan.outputs.lead) }}"
    assert jobs["build"]["strategy"]["matrix"]["digest"] == "${{ fromJSON(needs.plan.outputs.follow) }}"
    assert jobs["smoke"]["strategy"]["matrix"]["model"] == "${{ fromJSON(needs.plan.outputs.smoke) }}"
    assert "build-lead" in jobs["build"]["needs"]  # aiter's stage is in the registry cache first
    assert {"build-lead", "build"} <= set(jobs["smoke"]["needs"]) and "smoke" in jobs["tag"]["needs"]
    assert jobs["report"]["if"] == "${{ always() }}"
    uses = [s.get("uses", "") for s in jobs["plan"]["steps"]] + [
        s.get("uses", "") for s in jobs["report"]["steps"]
    ]
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)
    assert any(u.startswith("EnricoMi/publish-unit-test-result-action/") for u in uses)


class _ToolsContainer:
    """Answers the recipe-tools probe as an image would that lacks `missing` and has the rest."""

    def __init__(self, argv: list[str], missing: set[str]) -> None:
        self.exp = json.loads(argv[-1])
        self.missing = missing

    def __enter__(self) -> "_ToolsContainer":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def logs(self) -> str:
        tools = {t: (None if t in self.missing else f"/usr/bin/{t}") for t in self.exp["tools"]}
        modules = {m: (None if m in self.missing else f"/app/{m}.py") for m in self.exp["modules"]}
        return "TOOLS " + json.dumps({"tools": tools, "modules": modules}) + "\n"


def test_a_build_for_several_models_checks_each_other_models_recipe_tools_on_the_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One image for the models of one pair: the build runs the recipe-tools self-check of every
    model it did not render for; a tool the image lacks stops with that model named."""
    import io

    import pipeline.oci.engine
    from pipeline.config import load_settings
    from pipeline.image.selfcheck import SelfCheckError
    from pipeline.log import Logger
    from pipeline.rebuild import shared_image_tools

    recipe = (Path(__file__).resolve().parents[2] / "tests" / "servers" / "recipe-test.yaml").read_text()
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "B.yaml").write_text(recipe.replace("name: Smoke-Test-Tiny", "name: B"))
    (recipes / "C.yaml").write_text(
        recipe.replace("name: Smoke-Test-Tiny", "name: C").replace("- lm_eval\n", "- no-such-eval\n")
    )
    runs: list[str] = []

    class Fake:
        def run(self, image: str, command: list[str], **kw: Any) -> _ToolsContainer:
            runs.append(image)
            return _ToolsContainer(command, {"no-such-eval"})

        def close(self) -> None:
            pass

    monkeypatch.setattr(pipeline.oci.engine.Engine, "connect", classmethod(lambda cls, *a, **k: Fake()))
    settings = load_settings(env={"PIPELINE_RECIPES_DIR": str(recipes)}, cwd=tmp_path)
    out = io.StringIO()
    shared_image_tools(["B"], "sha256:" + "1" * 64, "d" * 64, settings, Logger(stream=out), {})
    assert runs == ["sha256:" + "1" * 64] and "B's recipe tools are in" in out.getvalue()
    with pytest.raises(SelfCheckError) as e:
        shared_image_tools(["B", "C"], "sha256:" + "1" * 64, "d" * 64, settings, Logger(stream=out), {})
    assert "the recipe of C runs" in str(e.value) and "`no-such-eval` is not in the image" in str(e.value)
    assert "The image is kept" in (e.value.hint or "")
