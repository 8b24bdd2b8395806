"""`pipeline build --model` as a user reads it: what is printed, in which order (fixture upstreams)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from tests.fixtures.build_repos import MODEL, BuildRepos, break_aiter


def test_a_check_failure_prints_the_report_then_the_table_then_the_error(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stage table and the one-line error end the output (a CI log shows its end), after the report."""
    break_aiter(world)
    assert main(["build", "--model", MODEL]) == ExitCode.INCOMPATIBLE
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    report = next(i for i, line in enumerate(lines) if "atom/models/minimax_m3.py" in line)
    table = next(i for i, line in enumerate(lines) if line.split()[:2] == ["stage", "status"])
    error = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    assert report < table < error
    assert [line.split()[0] for line in lines[table + 1 : error]] == ["pin", "patch", "check"]
    assert "nothing was built" in lines[error] and "--auto" in lines[error]
    assert all(
        not line.startswith(("error:", "✕", "x ")) for line in lines[error + 1 :] if "full log" not in line
    )


def test_a_bare_checks_advice_names_a_pin_command_that_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    from pipeline.commands.pin import command as pin_command
    from tests.fixtures.compat_repos import build_compat_repos, cli_on

    fx = build_compat_repos(tmp_path / "fx")
    args = cli_on(fx, "check", tmp_path, monkeypatch)
    assert main([*args, "--atom", fx.t["T1"], "--aiter", fx.a["A2"]]) == ExitCode.INCOMPATIBLE
    advice = re.findall(r"`pipeline pin([^`]*)`", capsys.readouterr().err)
    assert advice
    for flags in advice:
        argv = [a if a != "MODEL" else "MiniMax-M3-MXFP4" for a in flags.split()]
        pin_command.make_context("pin", argv)  # raises click.UsageError when a required flag is missing


def test_click_shell_completion_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("_PIPELINE_COMPLETE", "bash_source")
    assert main([]) == 0
    assert "_pipeline_completion()" in capsys.readouterr().out  # the script, not the usage text
    monkeypatch.setenv("_PIPELINE_COMPLETE", "bash_complete")
    monkeypatch.setenv("COMP_WORDS", "pipeline bui")
    monkeypatch.setenv("COMP_CWORD", "1")
    assert main([]) == 0
    assert "plain,build" in capsys.readouterr().out.splitlines()
    monkeypatch.setenv("COMP_WORDS", "pipeline build --mo")
    monkeypatch.setenv("COMP_CWORD", "2")
    assert main([]) == 0
    assert "plain,--model" in capsys.readouterr().out.splitlines()
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for name in ("Alpha-1", "Alpha-2", "Beta"):
        (recipes / f"{name}.yaml").write_text("x")
    monkeypatch.setenv("PIPELINE_RECIPES_DIR", str(recipes))
    monkeypatch.setenv("COMP_WORDS", "pipeline pin --model Al")
    monkeypatch.setenv("COMP_CWORD", "3")
    assert main([]) == 0
    assert capsys.readouterr().out.splitlines() == ["plain,Alpha-1", "plain,Alpha-2"]  # the recipes


def test_print_shows_the_plan_and_does_nothing(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    assert main(["build", "--model", MODEL, "--print"]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "runs").exists() and not (tmp_path / "locks").exists()  # nothing done
    assert "config     no pipeline.toml" in out and f"model      {MODEL}" in out
    for stage in ("pin", "patch", "check", "render", "build", "smoke", "tag"):
        assert f"  {stage:<6} run   a new run" in out
    assert "candidate-<inputs digest, known after render>" in out

    assert main(["build", "--model", MODEL, "--until", "render"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    before = sorted(p.name for p in run.rglob("*"))
    capsys.readouterr()
    assert main(["build", "--resume", str(run), "--until", "smoke", "--print", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(s["stage"], s["action"]) for s in plan["stages"]] == [
        ("pin", "skip"), ("patch", "skip"), ("check", "skip"), ("render", "skip"),
        ("build", "run"), ("smoke", "run"), ("tag", "no"),
    ]  # fmt: skip
    rendered = json.loads((run / "stages" / "render.json").read_text())["outputs"]["image_ref"]
    assert plan["image"]["candidate"] == rendered and plan["run_dir"] == str(run)
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written
    assert main(["build", "--context", str(run / "context"), "--print"]) == ExitCode.USAGE


def test_the_run_header_names_the_configuration_file(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pipeline.toml").write_text("[tag]\npush_latest = false\n")
    assert main(["build", "--model", MODEL, "--until", "pin"]) == 0
    assert f"  config     {tmp_path / 'pipeline.toml'}" in capsys.readouterr().err


def test_a_plain_check_on_actions_writes_the_job_summary_and_annotations_that_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.fixtures.compat_repos import build_compat_repos, cli_on

    fx = build_compat_repos(tmp_path / "fx")
    args = cli_on(fx, "check", tmp_path, monkeypatch)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main([*args, "--atom", fx.t["T1"], "--aiter", fx.a["A2"]]) == ExitCode.INCOMPATIBLE
    err = capsys.readouterr().err
    text = summary.read_text()
    assert "### pipeline check" in text and "| check | failed |" in text and "positional-shift" in text
    errors = [line for line in err.splitlines() if line.startswith("::error")]
    assert errors and not any("file=" in line for line in errors[:-1])  # ATOM's paths are not the job's
    assert all(re.match(r"::error::\S+\.py:\d+:\d+: ", line) for line in errors[:-1])


def test_an_annotation_links_to_the_atom_file_at_its_commit() -> None:
    from pipeline.compat.report import Finding
    from pipeline.stages.check import Inputs, _source_link
    from tests.unit.test_render import make_lock, settings

    lock = make_lock(settings(Path("/nonexistent")))
    finding = Finding(path="atom/models/minimax_m3.py", line=418, col=13, function="f", severity="error",
                      kind="positional-shift", message="m")  # fmt: skip
    pinned = Inputs(
        model="M", atom_rev=lock.atom.sha, aiter_rev=lock.aiter.sha, lock=lock, reports_dir=Path(".")
    )
    link = _source_link(pinned, lock.atom.sha, finding)
    assert link == f" (https://github.com/ROCm/ATOM/blob/{lock.atom.sha}/atom/models/minimax_m3.py#L418)"
    patched = pinned.model_copy(update={"dated_by": lock.atom.sha})
    assert f"/blob/{lock.atom.sha}/" in _source_link(
        patched, "f" * 40, finding
    ) and "patch series" in _source_link(patched, "f" * 40, finding)
