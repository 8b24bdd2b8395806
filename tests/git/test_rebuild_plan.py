"""`pipeline rebuild --write-plan`: one pin and one check for every model, one ATOM x aiter pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode, IncompatibleError, UsageError
from pipeline.lock import Lock
from pipeline.rebuild import Plan
from tests.fixtures.project import REPO, project_env, use_project
from tests.fixtures.reach_repos import ReachRepos, build_reach_repos, recipe_yaml


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> ReachRepos:
    return build_reach_repos(tmp_path_factory.mktemp("plan"))


def _env(fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fixtures.build_repos import AITER_BUILD_CMD, ATOM_INSTALL_CMD

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    # Alpha's own path has the break aiter's head brings; Gamma's does not.
    (recipes / "Alpha.yaml").write_text(recipe_yaml("Alpha", "AlphaForCausalLM"))
    (recipes / "Gamma.yaml").write_text(recipe_yaml("Gamma", "GammaForCausalLM"))
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "series").write_text("")
    env = project_env(
        tmp_path,
        fx.atom,
        fx.aiter,
        recipes=recipes,
        PIPELINE_ATOM_REF=fx.atom_sha,
        PIPELINE_AITER_REF=fx.aiter_sha,
        PIPELINE_TEMPLATES_DIR=str(REPO / "dockerfiles"),
        PIPELINE_AITER_BUILD_CMD=AITER_BUILD_CMD,
        PIPELINE_ATOM_INSTALL_CMD=ATOM_INSTALL_CMD,
    )
    use_project(monkeypatch, tmp_path, env)


def test_one_plan_one_pair_for_every_model(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(fx, tmp_path, monkeypatch)
    out = tmp_path / "pins"
    assert main(["rebuild", "--write-plan", str(out)]) == ExitCode.OK
    data = json.loads((out / "plan.json").read_text())
    assert data["schema"] == "atom-image-pipeline/rebuild-plan/v2"
    assert sorted(data["models"]) == ["Alpha", "Gamma"]
    # aiter's head breaks Alpha's path: the pair falls back once, for both models, to the aiter
    # Alpha was written against (the fixture's first aiter commit).
    assert data["atom"] == fx.atom_sha and data["aiter"] != fx.aiter_sha
    assert any("breaks ATOM" in n and "Alpha's path" in n for n in data["notes"])
    # whether a fix for the break is drafted (issue 31): none in this series
    assert (
        "Alpha: no draft fix in the series: `pipeline patch draft --model Alpha` drafts the mechanical fixes"
        in data["notes"]
    )
    for model, entry in data["models"].items():
        assert entry["status"] == "ok", (model, entry)
        lock = Lock.load(out / entry["lock"])
        assert (lock.model, lock.atom.sha, lock.aiter.sha) == (model, data["atom"], data["aiter"])
        report = json.loads((out / "reports" / model / "check.json").read_text())
        assert report["compatible"] is True and report["reach"]["architecture"] == f"{model}ForCausalLM"
    # Each model rendered: their locks differ only by the model (one pair, no patch), so they share
    # one image: one inputs digest, one build for both (each recipe's tools checked on it).
    alpha, gamma = data["models"]["Alpha"], data["models"]["Gamma"]
    locks = {m: Lock.load(out / e["lock"]) for m, e in data["models"].items()}
    assert locks["Alpha"].digest() != locks["Gamma"].digest()
    assert locks["Alpha"].pair_digest() == locks["Gamma"].pair_digest()
    assert len(alpha["inputs_digest"]) == 64 and alpha["inputs_digest"] == gamma["inputs_digest"]
    assert len(alpha["aiter_stage"]) == 64 and alpha["aiter_stage"] == gamma["aiter_stage"]
    assert [(b["models"], b["lead"]) for b in data["builds"]] == [(["Alpha", "Gamma"], True)]
    assert data["matrix"] == {
        "lead": [alpha["inputs_digest"]],
        "follow": [],
        "follow_first": [],
        "follow_rest": [],
        "smoke": ["Alpha", "Gamma"],
        "smoke_lead": ["Alpha", "Gamma"],
        "smoke_first": [],
        "smoke_rest": [],
        "left_out": [],
        "released": [],
    }
    # A model job builds exactly that lock: no pin of its own, no fallback.
    plan = Plan.load(out / "plan.json")
    req = plan.request("Gamma", None)
    assert req.lock == out / data["models"]["Gamma"]["lock"] and req.atom_ref is None and not req.auto_aiter
    with pytest.raises(UsageError, match="'Delta' is not in the rebuild plan"):
        plan.request("Delta", None)


def test_without_a_break_the_plan_is_the_configured_heads_and_a_refused_model_fails(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(fx, tmp_path, monkeypatch)
    out = tmp_path / "pins"
    assert main(["rebuild", "--model", "Gamma", "--write-plan", str(out), "--gpu-hosts", "3"]) == ExitCode.OK
    data = json.loads((out / "plan.json").read_text())
    assert data["aiter"] == fx.aiter_sha and data["notes"] == []  # nothing broke: the configured head
    assert data["gpu_hosts"] == 3 and Plan.load(out / "plan.json").gpu_hosts == 3  # the first wave's size
    # What a plan records for a model no common pair serves: its job fails with the plan's reason.
    plan = Plan.load(out / "plan.json")
    plan.models["Gamma"]["status"] = "incompatible"
    plan.models["Gamma"]["notes"] = ["aiter x breaks it"]
    with pytest.raises(IncompatibleError, match=r"the rebuild plan .* says incompatible: aiter x breaks it"):
        plan.request("Gamma", None)


def test_a_file_that_is_no_plan_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"schema": "something else"}')
    with pytest.raises(UsageError, match="is not a rebuild plan"):
        Plan.load(bad)
    assert main(["rebuild", "--plan", str(bad), "--write-plan", str(tmp_path / "x")]) == ExitCode.USAGE


def test_a_model_job_refuses_a_plan_lock_edited_after_the_plan(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lock a plan hands a model job is verified like any other (issue 27 §2): exit 12, nothing built."""
    _env(fx, tmp_path, monkeypatch)
    out = tmp_path / "pins"
    assert main(["rebuild", "--model", "Gamma", "--write-plan", str(out)]) == ExitCode.OK
    lock = out / json.loads((out / "plan.json").read_text())["models"]["Gamma"]["lock"]
    text = lock.read_text()
    date = Lock.load(lock).atom.date
    lock.write_text(text.replace(f'date = "{date}"', 'date = "2099-01-01T00:00:00Z"', 1))
    capsys.readouterr()
    code = main(["rebuild", "--model", "Gamma", "--plan", str(out / "plan.json")])
    err = capsys.readouterr().err
    assert code == ExitCode.LOCK_INCONSISTENT, err
    assert f"lock file {lock} is inconsistent" in err
    pins = {r: json.loads((r / "stages" / "pin.json").read_text()) for r in (tmp_path / "runs").iterdir()}
    ((run, pin),) = [(r, p) for r, p in pins.items() if p["status"] == "failed"]  # the model job's run
    assert not (run / "stages" / "render.json").exists()
    assert (
        "sources.atom.date" in pin["error"]
        and "2099-01-01T00:00:00Z" in pin["error"]
        and date in pin["error"]
    )


def test_a_plan_that_leaves_a_model_out_is_written_and_exits_with_its_code(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _env(fx, tmp_path, monkeypatch)
    (tmp_path / "recipes" / "Broken.yaml").write_text("name: [not a recipe\n")
    out = tmp_path / "pins"
    assert main(["rebuild", "--write-plan", str(out)]) == ExitCode.USAGE  # Broken's own exit code
    data = json.loads((out / "plan.json").read_text())  # written whole all the same
    assert {m: e["status"] for m, e in data["models"].items()} == {
        "Alpha": "ok",
        "Broken": "failed",
        "Gamma": "ok",
    }
    err = capsys.readouterr().err
    assert "leaves out 1 of 3 model(s) (Broken: failed)" in err


def test_a_failed_row_keeps_what_pin_and_check_found(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Render fails after pin and check passed: the row still names ATOM, aiter and the verdict."""
    _env(fx, tmp_path, monkeypatch)
    monkeypatch.setenv("PIPELINE_TEMPLATES_DIR", str(tmp_path / "no-templates"))
    assert main(["rebuild", "--model", "Gamma"]) == ExitCode.RENDER
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| Gamma |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].endswith("failed (exit 6)")
    assert cells[2] == fx.atom_sha[:9] and cells[3] == fx.aiter_sha[:10] and cells[4].startswith("compatible")


def test_a_build_job_takes_one_of_the_plans_digests_and_nothing_else(
    fx: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _env(fx, tmp_path, monkeypatch)
    out = tmp_path / "plan"
    assert main(["rebuild", "--model", "Gamma", "--write-plan", str(out)]) == ExitCode.OK
    capsys.readouterr()
    assert main(["rebuild", "--build", "0" * 64]) == ExitCode.USAGE  # no plan
    assert "--build takes --plan" in capsys.readouterr().err
    code = main(["rebuild", "--plan", str(out / "plan.json"), "--build", "0" * 64, "--candidate-dir", "c"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and "has no build with inputs digest '000000" in err
    assert not (tmp_path / "c").exists()  # nothing half-done


@pytest.fixture(scope="module")
def unfixable(tmp_path_factory: pytest.TempPathFactory) -> ReachRepos:
    """The reach fixture plus Delta: its path has the break aiter's head brings (a pin fixes it) and
    a call that binds at no aiter (`op1` takes one argument at every commit: no pin fixes it)."""
    from tests.fixtures import reach_repos as rr
    from tests.fixtures.gitfixture import commit_all, dedented, init_repo, write_files

    root = tmp_path_factory.mktemp("unfixable")
    op1 = "\ndef op1(a):\n    return a\n"
    aiter = init_repo(root / "aiter")
    write_files(aiter, {k: v + op1 for k, v in rr.AITER_OLD.items()})
    commit_all(aiter, "aiter op(a, b, c), op1(a)", "2026-01-01T00:00:00+00:00")
    files = dict(rr.ATOM_FILES)
    files["atom/model_engine/model_runner.py"] = files["atom/model_engine/model_runner.py"].replace(
        '"GammaForCausalLM": "atom.models.gamma.GammaForCausalLM",',
        '"GammaForCausalLM": "atom.models.gamma.GammaForCausalLM",\n'
        '            "DeltaForCausalLM": "atom.models.delta.DeltaForCausalLM",',
    )
    files["atom/models/delta.py"] = """
        import aiter


        class DeltaForCausalLM:
            def forward(self, x):
                from atom.model_ops.broken import run

                return run(x, x, x) + aiter.op1(x, x)
    """
    atom = init_repo(root / "atom")
    write_files(atom, dedented(files))
    atom_sha = commit_all(atom, "ATOM with four models", "2026-01-15T00:00:00+00:00")
    write_files(aiter, {k: v + op1 for k, v in rr.AITER_NEW.items()})
    aiter_sha = commit_all(aiter, "op: drop c", "2026-02-01T00:00:00+00:00")
    return ReachRepos(atom, aiter, atom_sha, aiter_sha)


def test_the_plan_never_falls_back_to_a_pair_the_models_own_check_refuses(
    unfixable: ReachRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delta's search finds an aiter without the head's break, but Delta's check fails there too (a
    call no pin fixes). Falling back for it gains nothing and moved Gamma, compatible with the head,
    off the head: the pair stays at the head, Delta is left out and the note says why."""
    _env(unfixable, tmp_path, monkeypatch)
    (tmp_path / "recipes" / "Alpha.yaml").unlink()
    (tmp_path / "recipes" / "Delta.yaml").write_text(recipe_yaml("Delta", "DeltaForCausalLM"))
    out = tmp_path / "pins"
    assert main(["rebuild", "--write-plan", str(out)]) == ExitCode.INCOMPATIBLE  # Delta's code
    data = json.loads((out / "plan.json").read_text())
    assert (data["atom"], data["aiter"]) == (unfixable.atom_sha, unfixable.aiter_sha)  # the heads
    assert data["models"]["Gamma"]["status"] == "ok"
    assert data["models"]["Delta"]["status"] == "incompatible"
    assert data["matrix"]["smoke"] == ["Gamma"] and data["matrix"]["left_out"] == ["Delta"]
    (said,) = [n for n in data["notes"] if "Delta's path" in n]
    assert "no fallback: at aiter" in said and "its check still fails" in said
    assert not any("every model builds aiter" in n for n in data["notes"])
