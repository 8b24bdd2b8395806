from pathlib import Path

import pytest

import pipeline.gitw  # noqa: F401  (GitPython runs `git version` on import: at collection, not in a test)
from pipeline import __version__
from pipeline.cli import COMMANDS, main
from pipeline.errors import ExitCode


def test_help_lists_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("pin", "check", "patch", "render", "build", "smoke", "tag", "rebuild"):
        assert f"  {name} " in out
    assert "Exit codes" in out and "130" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_unknown_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == ExitCode.USAGE
    assert "No such command" in capsys.readouterr().err


def test_config_error_exit_code_and_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "p.toml"
    cfg.write_text("[smoke]\nrun_all_checks = 3\n")
    assert main(["--config", str(cfg), "check", "--help"]) == 0  # help never needs a config
    code = main(["--config", str(cfg), "tag", "--image", "x"])
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "run_all_checks" in err and "boolean" in err


def test_every_registered_command_imports_and_the_stages_are_the_table() -> None:
    import importlib

    from pipeline.stages import STAGE_ORDER, TABLE

    assert list(COMMANDS)[: len(STAGE_ORDER)] == list(TABLE) == list(STAGE_ORDER)
    assert STAGE_ORDER == ("pin", "patch", "check", "render", "build", "smoke", "tag")
    for name in COMMANDS:
        assert importlib.import_module(f"pipeline.commands.{name}").command.name == name
    for name, entry in TABLE.items():
        stage = entry.load()
        assert name == stage.NAME
        assert stage.Inputs.model_config["frozen"] and stage.Outputs.model_config["frozen"]
        for fn in (stage.plan, stage.reads, stage.run):
            assert callable(fn)


def test_help_lists_the_commands_without_importing_any(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pipeline.cli

    def refuse(name: str) -> None:
        raise AssertionError(f"--help imported {name}")

    monkeypatch.setattr(pipeline.cli.importlib, "import_module", refuse)
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "pin → patch → check → render → build → smoke → tag" in out
    assert "Resolve ATOM and aiter refs" in out


def test_the_version_fast_path_says_what_click_says(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pipeline.__main__

    assert main(["--version"]) == 0
    from_click = capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["pipeline", "--version"])
    with pytest.raises(SystemExit) as e:
        pipeline.__main__.main()
    assert e.value.code == 0 and capsys.readouterr().out == from_click


def test_build_takes_the_flags_its_stages_hints_name() -> None:
    """Render's hint inside build says `--submodules in-build`; the offline base is `--base-image`."""
    from pipeline.commands.build import command

    flags = {opt for p in command.params for opt in getattr(p, "opts", [])}
    assert {"--submodules", "--base-image", "--lock", "--auto", "--offline"} <= flags


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--model", "MiniMax-M3-MXFP4", "--context", "."], "--model"),
        (["--context", ".", "--auto"], "--auto"),
        (["--model", "MiniMax-M3-MXFP4", "--lock", "l.toml", "--auto"], "--auto"),
        (["--model", "MiniMax-M3-MXFP4", "--lock", "l.toml", "--aiter", "main"], "--aiter"),
        (["--model", "MiniMax-M3-MXFP4", "--tag", "x:1"], "--tag"),
    ],
)
def test_build_refuses_a_flag_its_mode_would_ignore(
    args: list[str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    assert main(["build", *args]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "would be ignored" in err or "only apply with --context" in err
    assert named in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # refused before any run directory


def test_a_misspelled_command_gets_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["buidl", "--model", "M"]) == ExitCode.USAGE
    assert "Did you mean 'build'?" in capsys.readouterr().err


def test_help_lists_the_environment_and_where_configuration_is_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipeline.config import KEY_SECTION, OTHER_ENV

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in [f"PIPELINE_{k.upper()}" for k in KEY_SECTION] + list(OTHER_ENV):
        assert f"  {name} " in out
    assert "pipeline.toml from the working directory up to the repository root" in out.replace("\n  ", " ")
    assert "_PIPELINE_COMPLETE=bash_source" in out.replace("\n  ", " ")


def test_config_shows_each_value_with_its_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    (tmp_path / ".git").mkdir()
    (tmp_path / "pipeline.toml").write_text('[sources]\natom_ref = "dev"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    for name in [n for n in __import__("os").environ if n.startswith("PIPELINE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIPELINE_AITER_REF", "v1")
    assert main(["config", "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    where = str(tmp_path / "pipeline.toml")
    assert data["config_file"] == where
    assert data["settings"]["sources"]["atom_ref"] == {"value": "dev", "origin": where}
    assert data["settings"]["sources"]["aiter_ref"] == {"value": "v1", "origin": "env PIPELINE_AITER_REF"}
    assert data["settings"]["tag"]["cosign"] == {"value": False, "origin": "default"}
    assert f"configuration: {where} (found above the working directory)" in err  # said which one
    assert main(["config"]) == 0
    text = capsys.readouterr().out
    assert f"# configuration file: {where}" in text
    assert any(
        line.split() == ["sources.aiter_ref", "v1", "env", "PIPELINE_AITER_REF"] for line in text.splitlines()
    )


@pytest.mark.parametrize(("mode", "live"), [("plain", False), ("tty", True)])
def test_progress_mode_overrides_detection(mode: str, live: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from pipeline import progress

    seen: list[bool] = []
    monkeypatch.setattr("pipeline.commands.config.command.callback", lambda *a, **k: seen.append(
        progress.is_live(io.StringIO(), {"CI": "true"} if live else {})))  # fmt: skip
    assert main(["--progress", mode, "config"]) == 0
    assert seen == [live]
