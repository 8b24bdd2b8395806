import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.recipes.recipe import load_recipe
from pipeline.smoke import VERDICT_SCHEMA, CheckResult, Verdict, load_verdict
from pipeline.smoke.reports import write_reports
from pipeline.smoke.verdict import Derived, RecipeRef, TestedImage, derive, required_gates

SEED_LINE = "RuntimeError: aiter::_fused_qknorm_idxrqknorm_hip() Expected a value of type 'Optional[Tensor]'"


def verdict(status: str = "failed", checks: list[CheckResult] | None = None) -> Verdict:
    return Verdict(
        status=status,
        passed=status == "passed",
        reason=SEED_LINE if status != "passed" else "all passed",
        image=TestedImage(ref="atom:test", id="sha256:" + "a" * 64, digest="sha256:" + "b" * 64),
        recipe=RecipeRef(name="MiniMax-M3-MXFP4", path="recipes/MiniMax-M3-MXFP4.yaml", sha256="c" * 64),
        lock_sha256="d" * 64,
        inputs_digest="e" * 64,
        started="2026-06-24T15:36:00Z",
        finished="2026-06-24T15:37:00Z",
        tool_version="0.1.0",
        checks=checks
        if checks is not None
        else [
            CheckResult.fail(
                "server-ready", SEED_LINE, figures={"phase": "startup"}, evidence="Traceback ..."
            ),
            CheckResult.skipped("chat", "not run"),
        ],
    )


def test_reports_round_trip_and_shape(tmp_path: Path) -> None:
    v = verdict()
    path = write_reports(v, tmp_path, lambda s: s)
    data = json.loads(path.read_text())
    assert data["schema"] == VERDICT_SCHEMA and data["status"] == "failed" and data["passed"] is False
    assert data["image"] == {"ref": "atom:test", "id": "sha256:" + "a" * 64, "digest": "sha256:" + "b" * 64}
    assert set(data["recipe"]) == {"name", "path", "sha256"}
    assert {"name", "passed", "figures", "limits", "message"} <= set(data["checks"][0])
    assert load_verdict(tmp_path) == v
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("2", "1", "1")
    assert suite.find("testcase/failure").get("message") == SEED_LINE  # type: ignore[union-attr]
    summary = (tmp_path / "summary.md").read_text()
    assert "FAILED" in summary and SEED_LINE in summary and "| server-ready | ✕ failed |" in summary


def test_no_hardware_verdict_junit_has_an_error(tmp_path: Path) -> None:
    write_reports(verdict("no-hardware", checks=[]), tmp_path, lambda s: s)
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("errors") == "1" and suite.find("testcase/error") is not None


def test_reports_are_redacted(tmp_path: Path) -> None:
    v = verdict(checks=[CheckResult.fail("chat", "token hf_secret leaked", evidence="hf_secret")])
    write_reports(v, tmp_path, lambda s: s.replace("hf_secret", "***"))
    for p in tmp_path.iterdir():
        assert "hf_secret" not in p.read_text()


@pytest.mark.parametrize(
    ("mutate", "expect"),
    [
        (lambda d: d.update(schema="other/v1"), "is not a smoke verdict"),
        (lambda d: d.update(passed=True), "inconsistent"),
        (lambda d: d.pop("image"), "image: Field required"),
        (lambda d: d.update(status="maybe"), "status"),
    ],
)
def test_load_verdict_rejects_bad_files(tmp_path: Path, mutate, expect: str) -> None:  # type: ignore[no-untyped-def]
    write_reports(verdict(), tmp_path, lambda s: s)
    data = json.loads((tmp_path / "verdict.json").read_text())
    mutate(data)
    (tmp_path / "verdict.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=expect):
        load_verdict(tmp_path / "verdict.json")


def test_load_verdict_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Run `pipeline smoke`"):
        load_verdict(tmp_path)


# ------------------------------------------------------------------ the result, derived from the checks


def _gates(**options: object) -> list[str]:
    from tests.unit.test_smoke_runner import RECIPE_PATH

    return list(required_gates(load_recipe(RECIPE_PATH), options))


def test_required_gates_follow_the_recipe_and_the_recorded_options() -> None:
    assert _gates() == ["server-ready", "chat", "gsm8k", "serving-benchmark[c4]"]
    assert _gates(bench_concurrencies=[4, 8]) == [
        *_gates()[:3],
        "serving-benchmark[c4]",
        "serving-benchmark[c8]",
    ]
    for bad in ({"quick": 1}, {"gsm8k_limit": 0}, {"bench_concurrencies": ["4"]}, {"bench_tolerance": "x"}):
        with pytest.raises(ValueError, match="options"):
            _gates(**bad)


@pytest.mark.parametrize(
    ("accuracy", "passed"), [(None, True), (0.5, False)], ids=["healthy", "gsm8k below its bound"]
)
def test_what_the_smoke_runner_writes_derives_to_what_it_says(
    tmp_path: Path, accuracy: float | None, passed: bool
) -> None:
    """The tag stage re-derives the result: a runner's own verdict must agree with itself, both ways."""
    from tests.unit.test_smoke_runner import FakeContainer, smoke

    container = FakeContainer(["ready"]) if accuracy is None else FakeContainer(["ready"], accuracy=accuracy)
    written, _ = smoke(tmp_path, container, quick=True)
    v = load_verdict(tmp_path / "run")
    assert v.passed is written.passed is passed
    derived = derive(v, required_gates(load_recipe(Path(v.recipe.path)), v.options))
    assert derived.passed is passed and derived.status == v.status
    if not passed:
        assert any(p.startswith("check 'gsm8k' failed:") for p in derived.problems), derived.problems


def test_derive_names_every_disagreement() -> None:
    required = ["server-ready", "chat", "gsm8k"]
    ok = [CheckResult.ok(n, "fine") for n in required]
    assert derive(verdict("passed", ok), required) == Derived(True, [])
    lying = [ok[0], CheckResult(name="chat", passed=True, status="failed"), ok[0]]
    problems = derive(verdict("passed", lying), required).problems
    assert problems == [
        "check 'chat' says passed=true but status 'failed'",
        "check 'server-ready' appears 2 times",
        "the recipe's gate(s) 'gsm8k' are missing",
    ]
    assert derive(verdict("passed", []), required).problems == [
        "the recipe's gate(s) 'server-ready', 'chat', 'gsm8k' are missing"
    ]


def test_a_passed_check_is_read_by_its_figures_against_the_recipe() -> None:
    """A check edited to `passed` whose figures the recipe's limits fail still disagrees."""
    from tests.unit.test_smoke_runner import RECIPE_PATH

    gates = required_gates(load_recipe(RECIPE_PATH), {})
    gsm8k = CheckResult.ok("gsm8k", "edited", figures={"value": 0.41, "samples": 60})
    assert gates["gsm8k"](gsm8k).startswith(
        "its exact_match,flexible-extract 0.41 over 60 documents is below"
    )
    assert (
        gates["gsm8k"](CheckResult.ok("gsm8k", "no figures"))
        == "it records no value over a number of documents"
    )
    bench = {"output_throughput": 100.0, "mean_ttft_ms": 95.0, "mean_tpot_ms": 5.0, "completed": 19}
    problems = gates["serving-benchmark[c4]"](CheckResult.ok("serving-benchmark[c4]", "x", figures=bench))
    assert problems == (
        "19 of 20 requests completed; output 100.0 tok/s is below 300.0 - 50%; "
        "mean TTFT 95.0 ms is above 60.0 + 50%"
    )
    assert (
        gates["chat"](CheckResult.ok("chat", "x", figures={"http_status": 500}))
        == "it records HTTP 500, not 200"
    )
    v = verdict(
        "passed",
        [
            CheckResult.ok("server-ready", "up"),
            CheckResult.ok("chat", "x", figures={"http_status": 200}),
            gsm8k,
        ],
    )
    assert derive(v, {k: gates[k] for k in ("server-ready", "chat", "gsm8k")}).problems == [
        "check 'gsm8k' says passed but its exact_match,flexible-extract 0.41 over 60 documents is below "
        "the recipe's bound 0.8396"  # 0.9363 - 3 * sqrt(0.0067^2 + 0.9363 * 0.0637 / 60)
    ]
