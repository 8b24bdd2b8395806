from pathlib import Path

import pytest

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


def test_every_registered_command_imports() -> None:
    import importlib

    for module in COMMANDS.values():
        assert importlib.import_module(f"pipeline.commands.{module}").command is not None
