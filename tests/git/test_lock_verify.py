"""One lock verification everywhere a lock is read (issue 27 §2): each tampering is refused.

A final lock (after the patch stage) is edited one field at a time; `check --lock`,
`render --lock` and `build --lock` all refuse it with exit 12, the field's recorded and
actual values side by side, the lock file named and the repair command carrying `--lock F`.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.lock import Lock
from tests.fixtures.build_repos import MODEL, BuildRepos
from tests.git.test_orchestrate import only_run, states, world  # noqa: F401 (the fixture)


def _final_lock(tmp_path: Path) -> Path:
    assert main(["build", "--model", MODEL, "--until", "patch"]) == 0
    lock = tmp_path / "given.toml"
    shutil.copy(only_run(tmp_path) / "lock.toml", lock)
    return lock


def _sub(pattern: str, repl: str) -> Callable[[str, BuildRepos], str]:
    def edit(text: str, repos: BuildRepos) -> str:
        new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
        assert n == 1, pattern
        return new

    return edit


def _swap_atom(text: str, repos: BuildRepos) -> str:
    return text.replace(repos.atom_sha, repos.patched_sha)  # a real commit of the mirror, another one


EDITS = {
    # field shown in the error, the edit
    "patch-sha256": (".sha256", _sub(r'^sha256 = "[0-9a-f]{64}"', 'sha256 = "' + "0" * 64 + '"')),
    "patch-status": (".status", _sub(r'^status = "applied"', 'status = "not-needed"')),
    "atom-sha": ("sources.atom.date", _swap_atom),
    "source-date": ("sources.atom.date", _sub(r'^date = "[^"]*"', 'date = "2099-01-01T00:00:00Z"')),
    "base-digest": ("base_image.digest", _sub(r'^ref = "(example[^"@]*)@sha256:ab', r'ref = "\1@sha256:cd')),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_an_edited_lock_is_refused_by_check_render_and_build(
    case: str,
    world: BuildRepos,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lock = _final_lock(tmp_path)
    assert main(["check", "--lock", str(lock)]) == 0  # untouched, it is consistent
    field, edit = EDITS[case]
    lock.write_text(edit(lock.read_text(), world))
    Lock.load(lock)  # still a well-formed lock: only the verification can tell
    capsys.readouterr()

    assert main(["check", "--lock", str(lock)]) == ExitCode.LOCK_INCONSISTENT
    err = capsys.readouterr().err
    assert f"lock file {lock} is inconsistent" in err and field in err
    recorded = re.search(rf"{re.escape(field)}\s+recorded (\S+)\n\s+actual\s+(\S+)", err)
    assert recorded is not None and recorded.group(1) != recorded.group(2), err
    assert f"--lock {lock}" in err  # the repair acts on the file given, not on locks/<model>.toml
    assert "compatible" not in err

    assert main(["render", "--model", MODEL, "--lock", str(lock), "-o", "ctx"]) == ExitCode.LOCK_INCONSISTENT
    assert field in capsys.readouterr().err
    assert not (tmp_path / "ctx").exists()

    shutil.rmtree(tmp_path / "runs")
    assert main(["build", "--model", MODEL, "--lock", str(lock)]) == ExitCode.LOCK_INCONSISTENT
    assert states(only_run(tmp_path)) == {"pin": "failed"}  # nothing after pin ran


def test_the_repair_command_makes_the_lock_consistent_again(
    world: BuildRepos,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lock = _final_lock(tmp_path)
    good = lock.read_text()
    lock.write_text(EDITS["patch-status"][1](good, world))
    capsys.readouterr()
    assert main(["check", "--lock", str(lock)]) == ExitCode.LOCK_INCONSISTENT
    repair = re.findall(r"`(pipeline [^`]+)`", capsys.readouterr().err)
    assert repair == [f"pipeline patch apply --model {MODEL} --lock {lock}"]
    assert main(repair[0].split()[1:]) == 0
    assert lock.read_text() == good
    assert main(["check", "--lock", str(lock)]) == 0


def test_a_run_lock_edited_between_stages_stops_render(
    world: BuildRepos,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["build", "--model", MODEL, "--until", "check"]) == 0
    run = only_run(tmp_path)
    lock = run / "lock.toml"
    lock.write_text(EDITS["patch-sha256"][1](lock.read_text(), world))
    capsys.readouterr()
    assert main(["build", "--resume", str(run), "--until", "render"]) == ExitCode.LOCK_INCONSISTENT
    assert f"lock file {lock} changed after the patch stage" in capsys.readouterr().err
    render = json.loads((run / "stages" / "render.json").read_text())
    assert render["status"] == "failed"
    assert not (run / "context").exists()
