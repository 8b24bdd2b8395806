"""A plain `pipeline check` not recorded yet is answered without the CLI (pipeline/plaincheck.py),
printing what the CLI prints, and only the plain form with nothing the settings would add.

Whole processes on fixture repositories, each path in its own empty cache: the CLI's answer
(`PIPELINE_REPLAY=0` forces it) against the lean one, byte for byte but the stage's time.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import cli, plaincheck, replay
from pipeline.errors import SourceError
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos

ROOT = Path(__file__).resolve().parents[2]
_TIME = re.compile(r" check \(\d+\.\ds\)")


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> CompatRepos:
    return build_compat_repos(tmp_path_factory.mktemp("plaincheck") / "fx")


def _run(
    cwd: Path, cache: Path, argv: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """(the process, its stderr with the stage's time masked; the modules it imported)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "GITHUB_"))}
    base.update(PYTHONPATH=str(ROOT), PIPELINE_CACHE_DIR=str(cache), **(env or {}))
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pipeline", *argv],
        cwd=cwd,
        env=base,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = p.stderr.splitlines(keepends=True)
    imported = {ln.rsplit("|", 1)[1].strip() for ln in lines if ln.startswith("import time:")}
    p.stderr = _TIME.sub(" check (T)", "".join(ln for ln in lines if not ln.startswith("import time:")))
    return p, imported


def _argv(fx: CompatRepos, atom: str, aiter: str, *extra: str) -> list[str]:
    repos = ["--atom-repo", str(fx.atom), "--aiter-repo", str(fx.aiter)]
    return ["check", *repos, "--atom", atom, "--aiter", aiter, *extra]


def _lean_and_cli(
    tmp_path: Path, argv: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    lean, lean_imports = _run(tmp_path, tmp_path / "lean-cache", argv, env)
    cli, cli_imports = _run(tmp_path, tmp_path / "cli-cache", argv, {**(env or {}), "PIPELINE_REPLAY": "0"})
    assert "pipeline.compat.checker" in lean_imports  # it checked (no replay) ...
    assert not {"click", "pydantic", "pipeline.config", "pipeline.cli"} & lean_imports  # ... without the CLI
    assert "_hashlib" not in lean_imports  # ... and without OpenSSL (its digests are the CLI's)
    assert {"click", "pydantic", "pipeline.cli"} <= cli_imports  # PIPELINE_REPLAY=0: the CLI, always
    return lean, cli


@pytest.mark.parametrize("fmt", ["text", "json", "sarif"])
@pytest.mark.parametrize(("atom", "code"), [("T1", 4), ("T2", 0)])  # incompatible, compatible (with A4)
def test_the_lean_answer_is_the_clis(fx: CompatRepos, tmp_path: Path, fmt: str, atom: str, code: int) -> None:
    lean, cli = _lean_and_cli(tmp_path, _argv(fx, fx.t[atom], fx.a["A4"], "--format", fmt))
    assert (lean.returncode, lean.stdout, lean.stderr) == (cli.returncode, cli.stdout, cli.stderr)
    assert cli.returncode == code and cli.stdout  # (the comparison is of answers, not of two failures)
    assert "✓ check (T) — " in cli.stderr if code == 0 else "✕ check (T) — " in cli.stderr
    assert ("error: ATOM " in cli.stderr) == (code == 4)


def test_the_lean_answer_is_the_clis_with_a_secret(fx: CompatRepos, tmp_path: Path) -> None:
    # the secret masked everywhere (it is a word of the report); a setting the flags override
    env = {"HF_TOKEN": "kv_cache_v", "PIPELINE_ATOM_REF": "main"}
    lean, cli = _lean_and_cli(tmp_path, _argv(fx, fx.t["T1"], fx.a["A4"]), env)
    assert (lean.returncode, lean.stdout, lean.stderr) == (cli.returncode, cli.stdout, cli.stderr)
    assert "kv_cache_v" not in cli.stdout + cli.stderr and "***" in cli.stdout and cli.returncode == 4


def test_an_ascii_console_gets_the_clis_answer(fx: CompatRepos, tmp_path: Path) -> None:
    # click writes UTF-8 where Python would write ASCII: the lean path leaves it to click
    p, imported = _run(
        tmp_path, tmp_path / "cache", _argv(fx, fx.t["T1"], fx.a["A4"]), {"PYTHONIOENCODING": "ascii"}
    )
    assert "click" in imported and p.returncode == 4


@pytest.mark.parametrize(
    ("extra", "env", "project"),
    [
        (["--no-waivers"], {}, False),
        (["--model", "MiniMax-M3-MXFP4"], {}, False),
        ([], {"PIPELINE_FETCH_RETRIES": "5"}, False),  # a setting the CLI validates
        ([], {"PIPELINE_TYPO": "1"}, False),  # a variable the CLI warns about
        ([], {}, True),  # a project file in the working directory
        ([], {"GITHUB_ACTIONS": "true"}, False),  # groups and masks before the stage line
    ],
)
def test_anything_but_the_plain_form_is_the_clis(
    fx: CompatRepos, tmp_path: Path, extra: list[str], env: dict[str, str], project: bool
) -> None:
    if project:
        (tmp_path / "pipeline.toml").write_text("[sources]\nfetch_retries = 1\n", encoding="utf-8")
    p, imported = _run(tmp_path, tmp_path / "cache", _argv(fx, fx.t["T2"], fx.a["A4"], *extra), env)
    assert "click" in imported and "pipeline.cli" in imported
    assert p.returncode in (0, 2, 3) and "Traceback" not in p.stderr


def test_verbose_goes_to_the_cli(fx: CompatRepos, tmp_path: Path) -> None:
    p, imported = _run(tmp_path, tmp_path / "cache", ["-v", *_argv(fx, fx.t["T2"], fx.a["A4"])])
    assert "click" in imported and p.returncode == 0 and "▶ check: ATOM" in p.stderr


class _Console(io.StringIO):
    """A UTF-8 console (the lean path answers only where click would print the text as it is)."""

    @property
    def encoding(self) -> str:
        return "utf-8"


def _consoles(monkeypatch: pytest.MonkeyPatch) -> tuple[_Console, _Console]:
    out, err = _Console(), _Console()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    return out, err


def _flags(fx: CompatRepos) -> dict[str, str]:
    return {"atom": fx.t["T1"], "aiter": fx.a["A4"], "atom_repo": str(fx.atom), "aiter_repo": str(fx.aiter)}


def test_a_failure_inside_prints_nothing_and_leaves_the_answer_to_the_cli(
    fx: CompatRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.compat

    out, err = _consoles(monkeypatch)
    assert plaincheck.run(_flags(fx), {}, str(tmp_path / "cache")) == 4  # answered, as it is
    assert "✕ check (" in err.getvalue() and out.getvalue()

    def broken(*args: object, **kwargs: object) -> object:
        raise SourceError("the objects went away.")

    monkeypatch.setattr(pipeline.compat, "run_check", broken)
    out, err = _consoles(monkeypatch)
    assert plaincheck.run(_flags(fx), {}, str(tmp_path / "cache")) is None
    assert out.getvalue() == "" and err.getvalue() == ""  # the stage's ✕ line was held back


def test_an_interrupt_ends_as_the_cli_ends(
    fx: CompatRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.compat

    def interrupted(*args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.compat, "run_check", interrupted)
    out, err = _consoles(monkeypatch)
    assert plaincheck.run(_flags(fx), {}, str(tmp_path / "cache")) == 130
    assert out.getvalue() == ""
    assert re.fullmatch(
        r"■ check \(\d+\.\ds\)\nerror: interrupted; every container this run started was removed\.\n",
        err.getvalue(),
    )


def test_shell_completion_is_never_a_check(fx: CompatRepos, tmp_path: Path) -> None:
    assert replay.COMPLETE_VAR == cli.COMPLETE_VAR
    env = {"PATH": os.environ["PATH"], "PIPELINE_CACHE_DIR": str(tmp_path)}
    argv = _argv(fx, fx.t["T1"], fx.a["A4"])
    assert replay.key(argv, env, str(tmp_path)) is not None
    assert replay.key(argv, {**env, cli.COMPLETE_VAR: "bash_complete"}, str(tmp_path)) is None
