"""Reachability on a fixture ATOM: which findings can touch a model, and the gate that follows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.compat import run_check
from pipeline.compat.reach import ModelFacts, ReachError, apply_reach, compute_reach, gate_model
from pipeline.errors import ConfigError, ExitCode
from pipeline.gitw import GitRepo
from pipeline.recipes.recipe import parse_recipe
from tests.fixtures.gitfixture import commit_all, write_files
from tests.fixtures.project import project_env, use_project
from tests.fixtures.reach_repos import ReachRepos, build_reach_repos, recipe_yaml

BROKEN = "atom/model_ops/broken.py"
ORPHAN = "atom/model_ops/orphan.py"
QUANT = "atom/model_ops/quant_v4.py"
DSV4 = "atom/models/deepseek_v4.py"


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> ReachRepos:
    return build_reach_repos(tmp_path_factory.mktemp("reach"))


def reach(fx: ReachRepos, arch: str, **kw: object):  # type: ignore[no-untyped-def]
    return compute_reach(GitRepo(fx.atom), fx.atom_sha, ModelFacts(arch), **kw)  # type: ignore[arg-type]


def test_a_function_level_import_puts_the_module_on_the_path(fx: ReachRepos) -> None:
    r = reach(fx, "AlphaForCausalLM")
    assert r.model_module == "atom/models/alpha.py"
    assert r.on_path(BROKEN)
    assert [e.kind for e in r.chain(BROKEN)] == ["nested-import"]
    assert r.evidence(BROKEN) == (
        "AlphaForCausalLM reaches atom/model_ops/broken.py: atom/models/alpha.py -> "
        "atom/model_ops/broken.py (function-level import, alpha.py:6)"
    )


def test_a_qualname_string_alone_puts_the_module_on_the_path(fx: ReachRepos) -> None:
    r = reach(fx, "BetaForCausalLM")
    assert r.on_path(BROKEN)
    assert [e.kind for e in r.chain(BROKEN)] == ["string"]
    assert "qualname string, beta.py:3" in r.evidence(BROKEN)


def test_off_path_evidence_names_every_importer(fx: ReachRepos) -> None:
    r = reach(fx, "GammaForCausalLM")
    assert not r.on_path(BROKEN)
    assert r.evidence(BROKEN) == (
        "atom/model_ops/broken.py is imported only by atom/models/alpha.py:6 (itself off the path); "
        "atom/models/beta.py:3 (itself off the path): none is on GammaForCausalLM's path"
    )
    assert not r.on_path(ORPHAN)
    assert r.on_path("atom/kernels/fast.py")  # named through a package prefix string
    assert r.evidence(ORPHAN).startswith("nothing in ATOM ")
    assert r.evidence(ORPHAN).endswith("imports or names atom/model_ops/orphan.py")


def test_registry_selector_and_plugin_code_of_other_models_stay_off(fx: ReachRepos) -> None:
    r = reach(fx, "GammaForCausalLM")
    assert not r.on_path(DSV4) and not r.on_path(QUANT)
    ev = r.evidence(DSV4)
    assert "the registry entry for DeepseekV4ForCausalLM (atom/model_engine/model_runner.py:8)" in ev
    assert "atom/model_ops/v4_attn.py:3 (itself off the path)" in ev
    assert {"other-architecture", "use_v4", "standalone"} <= set(r.rules)
    rules = {x.rule for x in r.excluded}
    assert {"other-architecture", "use_v4", "standalone"} <= rules
    # The DeepSeek-V4 model itself reaches its quantization module.
    v4 = reach(fx, "DeepseekV4ForCausalLM")
    assert v4.on_path(DSV4) and v4.on_path(QUANT) and v4.on_path("atom/model_ops/v4_attn.py")
    assert "use_v4" not in v4.rules


def test_a_rule_whose_anchor_is_gone_is_not_applied(fx: ReachRepos, tmp_path: Path) -> None:
    """Sound: when ATOM no longer shows the fact a rule rests on, the edge is followed."""
    clone = tmp_path / "atom"
    shutil.copytree(fx.atom, clone)
    runner = (clone / "atom/model_engine/model_runner.py").read_text()
    runner = runner.replace("self.use_v4 = self.is_deepseek_v4()", "self.use_v4 = True")
    write_files(clone, {"atom/model_engine/model_runner.py": runner})
    sha = commit_all(clone, "use_v4 always", "2026-01-16T00:00:00+00:00")
    r = compute_reach(GitRepo(clone), sha, ModelFacts("GammaForCausalLM"))
    assert "use_v4" not in r.rules
    assert r.on_path(DSV4) and r.on_path(QUANT)
    assert "atom/utils/selector.py" in r.evidence(DSV4)


def test_unknown_architecture_and_moved_registry_are_clear_errors(fx: ReachRepos, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'NopeForCausalLM' is not in ATOM .* AlphaForCausalLM"):
        reach(fx, "NopeForCausalLM")
    clone = tmp_path / "atom2"
    shutil.copytree(fx.atom, clone)
    write_files(clone, {"atom/model_engine/model_runner.py": "x = 1\n"})
    sha = commit_all(clone, "registry moved", "2026-01-16T00:00:00+00:00")
    with pytest.raises(ReachError, match="the model registry moved"):
        compute_reach(GitRepo(clone), sha, ModelFacts("AlphaForCausalLM"))


def test_a_tree_without_the_registry_gates_every_finding(fx: ReachRepos, tmp_path: Path) -> None:
    clone = tmp_path / "atom3"
    shutil.copytree(fx.atom, clone)
    write_files(clone, {"atom/model_engine/model_runner.py": "x = 1\n"})
    sha = commit_all(clone, "registry moved", "2026-01-16T00:00:00+00:00")
    report = run_check(GitRepo(clone), sha, GitRepo(fx.aiter), fx.aiter_sha)
    gate = gate_model(report, GitRepo(clone), parse_recipe(recipe_yaml("Gamma", "GammaForCausalLM")))
    assert gate.reach is None and not gate.report.ok
    assert {f.reach for f in gate.report.findings} == {None}
    assert "reachability not computed" in gate.warnings[0] and "every finding gates" in gate.warnings[0]


def test_cached_by_tree(fx: ReachRepos, tmp_path: Path) -> None:
    cold = reach(fx, "AlphaForCausalLM", cache_dir=tmp_path)
    assert list(tmp_path.glob("compat-reach-v*-*.pickle"))
    warm = reach(fx, "AlphaForCausalLM", cache_dir=tmp_path)
    assert warm.parents == cold.parents and warm.tree_sha == cold.tree_sha


def test_findings_carry_reach_and_off_path_errors_warn(fx: ReachRepos) -> None:
    report = run_check(GitRepo(fx.atom), fx.atom_sha, GitRepo(fx.aiter), fx.aiter_sha)
    assert {f.path for f in report.errors} == {BROKEN, ORPHAN, QUANT}
    gated = apply_reach(report, reach(fx, "AlphaForCausalLM"))
    by = {f.path: f for f in gated.findings}
    assert by[BROKEN].reach == "on-path" and by[BROKEN].severity == "error"
    assert by[ORPHAN].reach == "off-path" and by[ORPHAN].severity == "warning"
    assert by[QUANT].message.startswith("off AlphaForCausalLM's path (atom/model_ops/quant_v4.py is imported")
    assert [f.path for f in gated.errors] == [BROKEN]
    assert by[BROKEN].to_json()["reach"] == "on-path"


def test_waiver_of_an_off_path_call_is_unnecessary(fx: ReachRepos) -> None:
    report = run_check(GitRepo(fx.atom), fx.atom_sha, GitRepo(fx.aiter), fx.aiter_sha)
    recipe = parse_recipe(recipe_yaml("Gamma", "GammaForCausalLM", waive=QUANT))
    gate = gate_model(report, GitRepo(fx.atom), recipe)
    assert gate.report.ok and gate.waived == 0 and gate.off_path == 3
    assert [n.status for n in gate.notes] == ["unnecessary"]
    assert "is unnecessary: the call is off the model's path" in gate.notes[0].message
    # An on-path break still needs its reviewed waiver.
    alpha = parse_recipe(recipe_yaml("Alpha", "AlphaForCausalLM", waive=BROKEN))
    gate = gate_model(report, GitRepo(fx.atom), alpha)
    assert gate.report.ok and gate.waived == 1 and gate.notes == ()


def _cli(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, arch: str
) -> tuple[int, str]:
    recipes = tmp_path / "recipes"
    recipes.mkdir(exist_ok=True)
    monkeypatch.setenv("PIPELINE_RECIPES_DIR", str(recipes))
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    (recipes / f"{name}.yaml").write_text(recipe_yaml(name, arch))
    out = tmp_path / f"{name}.json"
    code = main(
        [
            "check",
            "--atom-repo",
            str(fx.atom),
            "--aiter-repo",
            str(fx.aiter),
            "--atom",
            fx.atom_sha,
            "--aiter",
            fx.aiter_sha,
            "--model",
            name,
            "--format",
            "json",
            "-o",
            str(out),
        ]
    )
    return code, out.read_text()


def _pipeline_env(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models: dict[str, str], **extra: str
) -> None:
    """A project in tmp_path (recipes for `models`, an empty patch series) on the fixture repos."""
    for d in ("recipes", "patches"):
        (tmp_path / d).mkdir(exist_ok=True)
    (tmp_path / "patches" / "series").write_text("")
    for name, arch in models.items():
        (tmp_path / "recipes" / f"{name}.yaml").write_text(recipe_yaml(name, arch))
    env = project_env(tmp_path, fx.atom, fx.aiter, recipes=tmp_path / "recipes", **extra)
    use_project(monkeypatch, tmp_path, env)


def test_check_model_gates_on_the_models_path(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, text = _cli(fx, tmp_path, monkeypatch, "Alpha", "AlphaForCausalLM")
    assert code == ExitCode.INCOMPATIBLE
    findings = {f["path"]: f for f in json.loads(text)["findings"]}
    assert findings[BROKEN]["reach"] == "on-path" and findings[BROKEN]["severity"] == "error"
    assert findings[ORPHAN]["reach"] == "off-path"
    reach_json = json.loads(text)["reach"]
    assert (
        reach_json["architecture"] == "AlphaForCausalLM"
        and reach_json["model_module"] == "atom/models/alpha.py"
    )
    assert reach_json["followed"]["nested-import"] >= 1 and "standalone" in reach_json["rules"]
    code, text = _cli(fx, tmp_path, monkeypatch, "Gamma", "GammaForCausalLM")
    assert code == ExitCode.OK
    assert json.loads(text)["compatible"] is True
    assert {f["reach"] for f in json.loads(text)["findings"]} == {"off-path"}


@pytest.mark.parametrize(
    ("model", "arch", "code"), [("Gamma", "GammaForCausalLM", 0), ("Alpha", "AlphaForCausalLM", 4)]
)
def test_the_build_check_stage_gates_on_the_models_path(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, arch: str, code: int
) -> None:
    from tests.fixtures.build_repos import AITER_BUILD_CMD, ATOM_INSTALL_CMD

    root = Path(__file__).resolve().parents[2]
    _pipeline_env(
        fx, tmp_path, monkeypatch, {model: arch},
        PIPELINE_RUNS_DIR=str(tmp_path / "runs"),
        PIPELINE_TEMPLATES_DIR=str(root / "dockerfiles"),
        PIPELINE_AITER_BUILD_CMD=AITER_BUILD_CMD,
        PIPELINE_ATOM_INSTALL_CMD=ATOM_INSTALL_CMD,
    )  # fmt: skip
    assert main(["build", "--model", model, "--until", "check"]) == code
    (run,) = sorted((tmp_path / "runs").iterdir())
    findings = {f["path"]: f for f in json.loads((run / "check.json").read_text())["findings"]}
    if code == 0:
        stage = json.loads((run / "stages" / "check.json").read_text())
        assert stage["outputs"]["off_path"] == 3 and stage["outputs"]["architecture"] == arch
        assert "3 off the model's path" in stage["figure"]
        assert {f["reach"] for f in findings.values()} == {"off-path"}
    else:  # Alpha's own break gates; the two off its path are warnings
        assert findings[BROKEN]["reach"] == "on-path" and findings[BROKEN]["severity"] == "error"
        assert {findings[p]["severity"] for p in (ORPHAN, QUANT)} == {"warning"}


def test_pin_auto_gates_on_the_models_path(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # At aiter's head only Alpha's path breaks: for Gamma the head is the answer, as `check --model
    # Gamma` says; an off-path break must not walk the pin back (it did, when only waivers applied).
    _pipeline_env(fx, tmp_path, monkeypatch, {"Gamma": "GammaForCausalLM", "Alpha": "AlphaForCausalLM"})
    assert main(["pin", "--model", "Gamma", "--atom", fx.atom_sha, "--auto", "--json"]) == 0
    gamma = json.loads(capsys.readouterr().out)
    assert gamma["sources"]["aiter"]["sha"] == fx.aiter_sha
    assert main(["pin", "--model", "Alpha", "--atom", fx.atom_sha, "--auto", "--json"]) == 0
    alpha = json.loads(capsys.readouterr().out)
    assert alpha["sources"]["aiter"]["sha"] != fx.aiter_sha  # Alpha's own break walks it back
    assert alpha["auto"]["first_breaking"]["sha"] == fx.aiter_sha
