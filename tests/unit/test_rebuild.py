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
        "follow_first": [d2],  # one GPU host: one image to smoke early
        "follow_rest": [],
        "smoke": ["A", "B", "C", "D"],
        "smoke_lead": ["A", "B", "D"],
        "smoke_first": ["C"],
        "smoke_rest": [],
        "left_out": ["F"],
        "released": ["E"],
    }
    assert plan.build_of(d2)["models"] == ["C"]
    with pytest.raises(UsageError, match="has no build with inputs digest '4444"):
        plan.build_of(d4)  # released: nothing to build
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    assert json.loads((tmp_path / "plan.json").read_text())["matrix"] == plan.matrix()
    assert Plan.load(tmp_path / "plan.json").builds() == plan.builds()
    (tmp_path / "plan.json").write_text(json.dumps({**plan.to_json(), "gpu_hosts": "many"}))
    with pytest.raises(UsageError, match="has a gpu_hosts that is not a number of hosts"):
        Plan.load(tmp_path / "plan.json")


def test_the_plan_orders_each_smoke_wave_longest_first_and_builds_one_image_per_gpu_host_first() -> None:
    """LPT: the longest smoke tests start first; the lead is the build with the most smoke to run;
    the first follow builds make as many images as there are GPU hosts, to smoke while the rest build."""
    ok = {"status": "ok", "aiter_stage": "k"}
    lengths = {"A": 1200.0, "B": 3000.0, "C": 600.0, "D": 2400.0, "E": 1800.0, "F": None}
    models = {
        m: {**ok, "inputs_digest": str(i) * 64, "smoke_s": s} for i, (m, s) in enumerate(lengths.items())
    }
    plan = Plan("a" * 40, "b" * 40, models, gpu_hosts=2)
    m = plan.matrix()
    assert m["lead"] == [models["B"]["inputs_digest"]]  # 50 min of smoke: it starts first
    assert m["smoke"] == ["B", "D", "E", "F", "A", "C"]  # F records no length: 30 minutes
    assert (m["smoke_lead"], m["smoke_first"], m["smoke_rest"]) == (["B"], ["D", "E"], ["F", "A", "C"])
    assert m["follow_first"] == [models["D"]["inputs_digest"], models["E"]["inputs_digest"]]
    assert m["follow"] == m["follow_first"] + m["follow_rest"]  # every follow build, as before the waves
    one_host = Plan("a" * 40, "b" * 40, models).matrix()
    assert (one_host["smoke_first"], one_host["smoke_rest"]) == (["D"], ["E", "F", "A", "C"])


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
    assert set(jobs) == {
        "plan", "build-lead", "build-first", "build", "smoke-lead", "smoke-first", "smoke", "tag", "report"
    }  # fmt: skip
    hosted = ("ubuntu-latest",)
    assert jobs["plan"]["runs-on"] in hosted and jobs["report"]["runs-on"] in hosted  # no GPU, no build host
    for build in ("build-lead", "build-first", "build"):
        assert jobs[build]["runs-on"] == ["self-hosted", "linux", "build"]
    for smoke in ("smoke-lead", "smoke-first", "smoke"):
        assert jobs[smoke]["runs-on"] == ["self-hosted", "linux", "mi355"]
        assert jobs[smoke]["strategy"]["max-parallel"] == "${{ fromJSON(vars.MI355_RUNNERS || '1') }}"
    assert jobs["tag"]["concurrency"] == {
        "group": "tag-${{ github.repository }}",
        "cancel-in-progress": False,
    }

    def secrets(job: dict[str, Any]) -> set[str]:
        text = yaml.safe_dump(job)
        return set(re.findall(r"secrets\.(\w+)", text))

    assert secrets(jobs["plan"]) == secrets(jobs["report"]) == set()
    for build in ("build-lead", "build-first", "build"):
        assert secrets(jobs[build]) == {"REGISTRY_USER", "REGISTRY_PASSWORD"}
    for smoke in ("smoke-lead", "smoke-first", "smoke"):
        assert secrets(jobs[smoke]) == {"HF_TOKEN"}
    assert secrets(jobs["tag"]) == {"REGISTRY_USER", "REGISTRY_PASSWORD"}
    # write permissions only where something is published
    assert _workflow()["permissions"] == {"contents": "read"}
    assert jobs["plan"]["permissions"]["security-events"] == "write"
    assert jobs["report"]["permissions"]["checks"] == "write"


def test_the_matrices_are_the_plans_and_the_followers_wait_for_the_leads() -> None:
    jobs = _workflow()["jobs"]
    plan_keys = set(Plan("a" * 40, "b" * 40, {}).matrix())
    assert set(jobs["plan"]["outputs"]) <= plan_keys
    (plan_step,) = [s for s in jobs["plan"]["steps"] if s.get("run") == "scripts/ci/plan.sh"]
    assert plan_step["env"]["GPU_HOSTS"] == "${{ vars.MI355_RUNNERS || '1' }}"  # the first wave's size

    def matrix(job: str) -> str:
        (value,) = jobs[job]["strategy"]["matrix"].values()
        assert isinstance(value, str)
        return value

    # three waves: each smoke job needs the build job that makes its images, and nothing later
    for build, builds, smoke, smokes in (
        ("build-lead", "lead", "smoke-lead", "smoke_lead"),
        ("build-first", "follow_first", "smoke-first", "smoke_first"),
        ("build", "follow_rest", "smoke", "smoke_rest"),
    ):
        assert matrix(build) == f"${{{{ fromJSON(needs.plan.outputs.{builds}) }}}}"
        assert matrix(smoke) == f"${{{{ fromJSON(needs.plan.outputs.{smokes}) }}}}"
        assert set(jobs[smoke]["needs"]) == {"plan", build}
    # aiter's stage is in the registry cache before any follow build starts
    assert "build-lead" in jobs["build-first"]["needs"] and "build-first" in jobs["build"]["needs"]
    assert {"smoke-lead", "smoke-first", "smoke"} <= set(jobs["tag"]["needs"])
    assert set(jobs["report"]["needs"]) == set(jobs) - {"report"}
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


# -- what is released is what the registry's moving tag holds (issue 29: CI has no locks/ to carry) --


def _registry_world(tmp_path: Path, **env: str) -> tuple[Any, Any]:
    from pipeline.config import load_settings
    from tests.fixtures.registry_fake import FakeRegistry

    settings = load_settings(
        cwd=tmp_path,
        env={"PIPELINE_REGISTRY": "127.0.0.1:5000", "PIPELINE_REPOSITORY": "atom/dev", **env},
    )
    return settings, FakeRegistry()


def _push(fake: Any, tag: str, inputs_digest: str, *, index: bool = False) -> None:
    from pipeline import labels
    from pipeline.oci.registry import MEDIA_DOCKER_MANIFEST

    config = fake.add_blob(json.dumps({"config": {"Labels": {labels.INPUTS_DIGEST: inputs_digest}}}).encode())
    image = json.dumps(
        {"schemaVersion": 2, "mediaType": MEDIA_DOCKER_MANIFEST, "config": {"digest": config}, "layers": []}
    ).encode()
    if not index:
        fake.add("atom/dev", tag, image)
        return
    empty = json.dumps({"config": {"digest": fake.add_blob(b"{}")}}).encode()
    attestation = fake.add("atom/dev", "att", empty)
    image_digest = fake.add("atom/dev", "img", image)
    body = {
        "schemaVersion": 2,
        "manifests": [  # buildx's attestation manifest may come first: it is not the image
            {"digest": attestation, "platform": {"os": "unknown", "architecture": "unknown"}},
            {"digest": image_digest, "platform": {"os": "linux", "architecture": "amd64"}},
        ],
    }
    fake.add("atom/dev", tag, json.dumps(body).encode(), "application/vnd.oci.image.index.v1+json")


def test_the_registrys_moving_tag_says_whether_an_inputs_digest_is_released(tmp_path: Path) -> None:
    from pipeline.rebuild import released_in_registry
    from tests.fixtures.registry_fake import fake_session

    settings, fake = _registry_world(tmp_path)
    d1, d2 = "1" * 64, "2" * 64
    _push(fake, "A-verified", d1)
    _push(fake, "B-verified", d2, index=True)
    session = fake_session(fake)
    got, said = released_in_registry(settings, "A", d1, {}, session=session)
    assert got is True and said == f"127.0.0.1:5000/atom/dev:A-verified holds inputs digest {d1[:12]}"
    assert released_in_registry(settings, "A", d2, {}, session=session)[0] is False  # changed: build it
    assert released_in_registry(settings, "B", d2, {}, session=session)[0] is True  # an index
    got, said = released_in_registry(settings, "C", d1, {}, session=session)
    assert got is False and said.endswith("atom/dev:C-verified does not exist")
    fake.add("atom/dev", "D-verified", b'{"schemaVersion": 2}')  # no config: not an image we released
    got, said = released_in_registry(settings, "D", d1, {}, session=session)
    assert got is False and said.endswith(":D-verified has no readable config: not counted as released")


def test_when_the_registry_cannot_say_the_locks_decide(tmp_path: Path) -> None:
    from pipeline.rebuild import released_in_registry
    from tests.fixtures.registry_fake import fake_session

    settings, fake = _registry_world(tmp_path)
    _push(fake, "A-verified", "1" * 64)
    fake.fail = [503] * 10  # no answer after the retries
    got, said = released_in_registry(settings, "A", "1" * 64, {}, session=fake_session(fake))
    assert got is None and said.startswith("A: the registry could not say what is released (")
    offline, _ = _registry_world(tmp_path, PIPELINE_OFFLINE="1")
    assert released_in_registry(offline, "A", "1" * 64, {}, session=fake_session(fake)) == (None, "")
    no_registry, _ = _registry_world(tmp_path, PIPELINE_REGISTRY="")
    assert released_in_registry(no_registry, "A", "1" * 64, {}) == (None, "")
    dated = settings.model_copy(
        update={"tag": settings.tag.model_copy(update={"moving_tags": ["{model}-{date}"]})}
    )  # no moving tag of the model alone: nothing to read
    assert released_in_registry(dated, "A", "1" * 64, {}, session=fake_session(fake)) == (None, "")
