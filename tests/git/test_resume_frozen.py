"""A run is frozen (issue 27 §1): `--resume` runs from the run's own state, on the fixture repositories.

The run keeps its settings, its pin and its SOURCE_DATE_EPOCH; a contradicting flag is refused
(exit 2, both values); a configuration that changed is named; re-pinning needs `--repin` and says
what moved; every stage that runs again says which input changed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.lock import Lock
from tests.fixtures.build_repos import CK_PATH, MODEL, BuildRepos, break_aiter
from tests.fixtures.project import only_run, run_until, states


def _settings(run: Path) -> dict[str, dict[str, object]]:
    spec: dict[str, dict[str, dict[str, object]]] = json.loads((run / "run.json").read_text())
    return spec["settings"]


def test_a_resumed_run_keeps_its_settings_and_refuses_a_contradicting_flag(
    world: BuildRepos,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["build", "--model", MODEL, "--submodules", "in-build", "--until", "check"]) == 0
    run = only_run(tmp_path)
    frozen = _settings(run)
    assert frozen["image"]["submodules"] == "in-build"
    assert "docker_host" not in frozen["smoke"] and "cache_dir" not in frozen["paths"]  # host-local

    capsys.readouterr()
    assert main(["build", "--resume", str(run), "--submodules", "mirror"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "[image] submodules = 'mirror' (the run has 'in-build')" in err
    assert "docker_host" in err  # the host-local settings that may differ are listed
    assert states(run) == {"pin": "ok", "patch": "ok", "check": "ok"}  # nothing ran

    # the submodule has no mirror on this host: only the run's `in-build` can render it
    for mirror in (tmp_path / "cache" / "mirrors").glob("*composable_kernel*.git"):
        shutil.rmtree(mirror)
    # the configuration changed meanwhile: named, and the run keeps its own value
    (tmp_path / "pipeline.toml").write_text('[image]\nmax_jobs = "3"\n')
    assert main(["build", "--resume", str(run), "--until", "render"]) == 0
    err = capsys.readouterr().err
    assert "[image] max_jobs is now '3'" in err and "this run keeps" in err
    render = json.loads((run / "stages" / "render.json").read_text())
    assert render["inputs"]["image"]["submodules"] == "in-build"  # without the flag: the run's setting
    assert render["inputs"]["image"]["max_jobs"] == frozen["image"]["max_jobs"] != "3"
    assert (run / "context" / "aiter").is_dir()
    assert not (run / "context" / "aiter" / CK_PATH / "include" / "ck.hpp").exists()  # fetched in the build


def test_a_resumed_run_keeps_its_pin_unless_repin(
    world: BuildRepos,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = run_until("patch", tmp_path)
    pinned = Lock.load(run / "lock.toml").aiter.sha
    # upstream aiter moves on, and locks/<model>.toml is re-pinned to the new pair
    moved = break_aiter(world)
    assert main(["pin", "--model", MODEL]) == 0
    assert Lock.load(tmp_path / "locks" / f"{MODEL}.toml").aiter.sha == moved
    capsys.readouterr()

    assert main(["build", "--resume", str(run), "--until", "check"]) == 0
    err = capsys.readouterr().err
    assert "↷ pin" in err and "↷ patch" in err
    assert Lock.load(run / "lock.toml").aiter.sha == pinned  # the run's pair, not the new one

    # re-pinning is explicit, and says what moved; the new pair then breaks the check
    assert main(["build", "--resume", str(run), "--repin", "--until", "check"]) == ExitCode.INCOMPATIBLE
    err = capsys.readouterr().err
    assert "pin runs again: --repin" in err
    assert f"aiter {pinned[:10]} → ATOM" in err and f"aiter {moved[:10]}" in err
    assert Lock.load(run / "lock.toml").aiter.sha == moved


def test_a_stage_that_runs_again_says_which_input_changed(
    world: BuildRepos,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = run_until("check", tmp_path)
    before = json.loads((run / "stages" / "patch.json").read_text())["reads"]
    patch = next((tmp_path / "patches").glob("0001-*.patch"))
    patch.write_text(patch.read_text().replace("Fixture patch: insert kv_cache_v.", "Fixture patch, v2."))
    capsys.readouterr()
    assert main(["build", "--resume", str(run), "--until", "check"]) == 0
    err = capsys.readouterr().err
    old = before[str(tmp_path / "patches")]
    new = json.loads((run / "stages" / "patch.json").read_text())["reads"][str(tmp_path / "patches")]
    assert f"patch runs again: {tmp_path / 'patches'} changed ({old[:12]} → {new[:12]})" in err
    assert "check runs again: input atom_rev changed (" in err
    assert "↷ pin" in err


def test_repin_goes_with_resume(world: BuildRepos, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "--model", MODEL, "--repin"]) == ExitCode.USAGE
    assert "--repin re-pins a run: it goes with --resume DIR" in capsys.readouterr().err


def test_a_run_directory_moved_elsewhere_resumes_with_nothing_done_again(
    world: BuildRepos,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = run_until("render", tmp_path)
    moved = tmp_path / "elsewhere" / run.name
    shutil.copytree(run, moved)
    shutil.rmtree(run)
    records = "".join(p.read_text() for p in (moved / "stages").glob("*.json"))
    assert str(run) not in records and "$RUN/context" in records  # no path of the first place
    capsys.readouterr()
    assert main(["build", "--resume", str(moved), "--until", "render"]) == 0
    err = capsys.readouterr().err
    for stage in ("pin", "patch", "check", "render"):
        assert f"↷ {stage}" in err, err
    assert "runs again" not in err
