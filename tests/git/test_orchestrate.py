"""`pipeline build --model` up to render, on fixture upstreams (real git, no docker).

pin → check → patch → render run for real on the fixture ATOM/aiter repositories; the
docker tier (tests/docker/test_e2e.py) drives the same chain through build, smoke and tag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.lock import Lock
from pipeline.runs import RunDir
from tests.fixtures.build_repos import (
    MODEL,
    BuildRepos,
    break_aiter,
    run_git,
)
from tests.fixtures.project import FAKE_DIGEST, REPO, only_run, run_until, states


def test_chain_until_render_then_resume_skips_everything(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_until("render", tmp_path)
    assert states(run) == {"pin": "ok", "patch": "ok", "check": "ok", "render": "ok"}
    spec = json.loads((run / "run.json").read_text())
    assert spec["model"] == MODEL and spec["stages"] == ["pin", "patch", "check", "render"]
    lock = (run / "lock.toml").read_text()
    assert world.atom_sha in lock and world.aiter_sha in lock and 'status = "applied"' in lock
    # the pristine pin breaks; the patched tree binds: the check says both
    assert json.loads((run / "check-pristine.json").read_text())["findings"]
    findings = json.loads((run / "check.json").read_text())["findings"]
    assert not [f for f in findings if f["severity"] == "error"]
    # the context holds the patched ATOM
    patched = (run / "context" / "atom" / "atom" / "models" / "minimax_m3.py").read_text()
    assert "kv_cache_v" in patched
    err = capsys.readouterr().err
    assert re.search(r"^stage\s+status\s+duration\s+figure$", err, re.M), err
    assert re.search(r"^render\s+ok\s", err, re.M), err

    assert main(["build", "--resume", str(run), "--until", "render"]) == 0
    err = capsys.readouterr().err
    for stage in ("pin", "patch", "check", "render"):
        assert f"↷ {stage}" in err, err


def test_patch_change_reruns_from_patch_not_pin(world: BuildRepos, tmp_path: Path) -> None:
    run = run_until("check", tmp_path)
    before = {s: json.loads((run / "stages" / f"{s}.json").read_text()) for s in ("pin", "patch", "check")}
    patch = next((tmp_path / "patches").glob("0001-*.patch"))
    patch.write_text(patch.read_text().replace("Fixture patch: insert kv_cache_v.", "Fixture patch, v2."))
    assert main(["build", "--resume", str(run), "--until", "check"]) == 0
    after = {s: json.loads((run / "stages" / f"{s}.json").read_text()) for s in ("pin", "patch", "check")}
    assert after["pin"] == before["pin"]  # not re-run: the same record, the same duration
    assert after["patch"]["inputs_digest"] != before["patch"]["inputs_digest"]
    assert after["check"]["inputs_digest"] != before["check"]["inputs_digest"]


def test_unfixed_break_stops_before_render_and_names_the_cause(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    breaking = break_aiter(world)
    assert main(["build", "--model", MODEL]) == ExitCode.INCOMPATIBLE
    run = only_run(tmp_path)
    assert states(run) == {"pin": "ok", "patch": "ok", "check": "failed"}
    assert not (run / "context").exists()
    err = capsys.readouterr().err
    assert "atom/models/minimax_m3.py" in err
    assert breaking[:10] in err  # the aiter commit that changed the signature
    assert "kv_scale" in err and "nothing was built" in err


def test_a_run_driven_by_another_process_is_refused(world: BuildRepos, tmp_path: Path) -> None:
    assert main(["build", "--model", MODEL, "--until", "pin"]) == 0
    run = RunDir.existing(only_run(tmp_path))
    run.acquire()
    try:
        assert main(["build", "--resume", str(run.path), "--until", "check"]) == ExitCode.LOCKED
    finally:
        run.release()
    assert main(["build", "--resume", str(run.path), "--until", "check"]) == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["build", "--model", "No-Such-Model"], "(known: MiniMax-M3-MXFP4)"),
        (["build", "--model", MODEL, "--from", "render", "--until", "pin"], "comes after"),
        (["build"], "--model"),
    ],
)
def test_usage_errors(
    world: BuildRepos, args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == ExitCode.USAGE
    assert needle in capsys.readouterr().err


def test_recipe_waiver_lets_a_reviewed_break_through_and_keeps_it_visible(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    break_aiter(world)
    world.recipe.write_text(
        world.recipe.read_text()
        + "\ncompat:\n  waive:\n"
        + "    - path: atom/models/minimax_m3.py\n"
        + "      function: aiter.ops.fused_qknorm_idxrqknorm.fused_qknorm_idxrqknorm\n"
        + '      reason: "reviewed: this model never reaches the call"\n'
        + "    - path: atom/models/other.py\n"
        + "      function: aiter.gone\n"
        + "      reason: a waiver whose call upstream already fixed\n"
    )
    assert main(["build", "--model", MODEL, "--until", "check"]) == 0
    err = capsys.readouterr().err
    assert "1 waived by the recipe" in err
    assert "waiver for aiter.gone in atom/models/other.py matches no finding" in err
    findings = json.loads((only_run(tmp_path) / "check.json").read_text())["findings"]
    (waived,) = [f for f in findings if f["path"] == "atom/models/minimax_m3.py"]
    assert (
        waived["severity"] == "warning" and "reviewed: this model never reaches the call" in waived["message"]
    )


def test_one_waiver_for_two_call_sites_is_counted_twice_everywhere(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 15 §3: the report, its JSON and the stage line count the same waived findings."""
    run_git(world.atom, "checkout", "-q", world.patched_sha)  # the split-kv call, then a second one
    module = world.atom / "atom" / "models" / "minimax_m3.py"
    call = module.read_text().splitlines()[-1]
    module.write_text(
        module.read_text()
        + "\n\ndef forward_again(q, k, kv_cache_k, kv_cache_v, index_cache):\n"
        + call
        + "\n"
    )
    run_git(world.atom, "commit", "-q", "-am", "a second call site")
    atom = run_git(world.atom, "rev-parse", "HEAD")
    breaking = break_aiter(world)  # both calls now shift a slot
    world.recipe.write_text(
        world.recipe.read_text()
        + "\ncompat:\n  waive:\n"
        + "    - path: atom/models/minimax_m3.py\n"
        + "      function: aiter.ops.fused_qknorm_idxrqknorm.fused_qknorm_idxrqknorm\n"
        + '      reason: "reviewed: both calls"\n'
    )
    args = ["check", "--atom", atom, "--aiter", breaking, "--model", MODEL]
    capsys.readouterr()
    assert main([*args, "--no-waivers"]) == ExitCode.INCOMPATIBLE
    assert "INCOMPATIBLE: 2 error(s), 0 warning(s);" in capsys.readouterr().out
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "compatible: 0 error(s), 2 warning(s) (2 waived by the recipe);" in out
    assert "0 error(s), 2 warning(s) (2 waived by the recipe);" in err  # the stage line
    assert main([*args, "--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert (counts["errors"], counts["warnings"], counts["waived"], counts["off_path"]) == (0, 2, 2, 0)


def test_check_with_a_lock_applies_the_models_recipe_waivers(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = str(run_until("patch", tmp_path) / "lock.toml")  # the lock records the patch
    assert main(["check", "--lock", lock]) == 0
    # a newer aiter breaks the patched call; check that pair (the lock's ATOM, the new aiter)
    breaking = break_aiter(world)
    # the aiter SHA swapped by hand: the lock is inconsistent (its date and subject are another commit's)
    text = Path(lock).read_text().replace(world.aiter_sha, breaking)
    Path(tmp_path / "swapped.toml").write_text(text)
    capsys.readouterr()
    assert main(["check", "--lock", str(tmp_path / "swapped.toml")]) == ExitCode.LOCK_INCONSISTENT
    err = capsys.readouterr().err
    assert "sources.aiter.sha" in err and f"recorded {breaking}" in err  # not in the mirror
    assert f"--lock {tmp_path / 'swapped.toml'}" in err  # the repair acts on the file given
    # the same pair pinned and patched honestly: a consistent lock, and the check says incompatible
    lock = str(tmp_path / "broken.toml")
    atom = Lock.load(tmp_path / "swapped.toml").atom.sha
    assert main(["pin", "--model", MODEL, "--lock", lock, "--atom", atom, "--aiter", breaking]) == 0
    assert main(["patch", "apply", "--model", MODEL, "--lock", lock]) == 0
    args = ["check", "--lock", lock, "--aiter-repo", str(world.aiter)]  # the upstream, not the mirror
    assert main(args) == ExitCode.INCOMPATIBLE
    world.recipe.write_text(
        world.recipe.read_text()
        + "\ncompat:\n  waive:\n"
        + "    - path: atom/models/minimax_m3.py\n"
        + "      function: aiter.ops.fused_qknorm_idxrqknorm.fused_qknorm_idxrqknorm\n"
        + "      reason: reviewed, not on this model's path\n"
    )
    capsys.readouterr()
    assert main(args) == 0
    assert "waived by the recipe (reviewed, not on this model's path)" in capsys.readouterr().out
    assert main([*args, "--no-waivers"]) == ExitCode.INCOMPATIBLE


def test_a_patch_past_its_range_is_reported_obsolete(world: BuildRepos, tmp_path: Path) -> None:
    from pipeline.config import load_settings
    from pipeline.rebuild import obsolete_patches

    patch = next((tmp_path / "patches").glob("0001-*.patch"))
    start = f"X-Atom-Range: {world.atom_sha[:12]}.."
    # upstream merged the fix at this very ATOM commit: the range now ends here
    patch.write_text(patch.read_text().replace(start, start + world.atom_sha[:12]))
    run = run_until("patch", tmp_path)
    assert 'status = "not-needed"' in (run / "lock.toml").read_text()
    (note,) = obsolete_patches(load_settings(env=dict(os.environ), cwd=tmp_path), run)
    assert "0001-minimax-m3-split-kv-cache.patch is obsolete" in note and "past its range" in note


def records(run: Path) -> dict[str, dict[str, object]]:
    return {p.stem: json.loads(p.read_text()) for p in (run / "stages").glob("*.json")}


@pytest.mark.parametrize(
    ("edit", "first_rerun"),
    [("patch", "patch"), ("recipe", "check"), ("template", "render")],
)
def test_changing_one_input_file_reruns_its_stage_and_those_after_it_and_nothing_before(
    world: BuildRepos,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    edit: str,
    first_rerun: str,
) -> None:
    templates = tmp_path / "templates"
    shutil.copytree(REPO / "dockerfiles", templates)
    monkeypatch.setenv("PIPELINE_TEMPLATES_DIR", str(templates))
    run = run_until("render", tmp_path)
    before = records(run)
    dockerfile = (run / "context" / "Dockerfile").read_text()
    if edit == "patch":
        f = next((tmp_path / "patches").glob("0001-*.patch"))
        f.write_text(f.read_text().replace("Fixture patch: insert kv_cache_v.", "Fixture patch, v2."))
    elif edit == "recipe":
        world.recipe.write_text(world.recipe.read_text() + "\n# reviewed again\n")
    else:
        f = templates / "Dockerfile.j2"
        f.write_text(f.read_text().replace("FROM ", "# edited template\nFROM ", 1))
    capsys.readouterr()
    assert main(["build", "--resume", str(run), "--until", "render"]) == 0
    after = records(run)
    err = capsys.readouterr().err
    order = ["pin", "patch", "check", "render"]
    for stage in order:
        if order.index(stage) < order.index(first_rerun):
            assert after[stage] == before[stage] and f"↷ {stage}" in err, stage
        else:
            assert after[stage]["inputs_digest"] != before[stage]["inputs_digest"], stage
            assert f"✓ {stage}" in err, stage
    if edit == "template":  # the resumed render wrote the edited template's Dockerfile
        assert "# edited template" in (run / "context" / "Dockerfile").read_text()
        assert "# edited template" not in dockerfile


def test_source_date_epoch_sets_created_in_build_as_in_render(
    world: BuildRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    run = run_until("render", tmp_path)
    built = json.loads((run / "context" / "render.json").read_text())
    assert built["labels"]["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"
    args = [
        "render",
        "--model",
        MODEL,
        "--lock",
        str(run / "lock.toml"),
        "-o",
        str(tmp_path / "ctx"),
        "--json",
    ]
    capsys.readouterr()
    assert main(args) == 0
    rendered = json.loads(capsys.readouterr().out)
    assert rendered["inputs_digest"] == built["inputs_digest"]


def test_build_takes_a_digested_base_image_other_than_the_configured_one(
    world: BuildRepos, tmp_path: Path
) -> None:
    other = "other.invalid/img:2@sha256:" + "cd" * 32
    assert main(["build", "--model", MODEL, "--until", "render", "--base-image", other]) == 0
    assert f"FROM {other}" in (only_run(tmp_path) / "context" / "Dockerfile").read_text()


def test_a_plain_pin_keeps_the_digest_given_by_hand(
    world: BuildRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPELINE_BASE_IMAGE", "example.invalid/base:1")  # no digest, no registry answers
    digested = f"example.invalid/base:1@{FAKE_DIGEST}"
    assert main(["pin", "--model", MODEL, "--base-image", digested]) == 0
    assert main(["pin", "--model", MODEL, "--offline"]) == 0
    lock = (tmp_path / "locks" / f"{MODEL}.toml").read_text()
    assert FAKE_DIGEST in lock


def test_build_with_a_lock_shows_the_locks_sources(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = run_until("patch", tmp_path) / "lock.toml"
    shutil.move(str(only_run(tmp_path)), str(tmp_path / "first"))
    lock = tmp_path / "first" / "lock.toml"
    capsys.readouterr()
    assert main(["build", "--model", MODEL, "--until", "pin", "--lock", str(lock)]) == 0
    err = capsys.readouterr().err
    assert f"ATOM       {world.atom} @ {world.atom_sha}" in err and "@ main" not in err


def test_bad_values_fail_at_the_start_with_one_short_message(
    world: BuildRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    long = "M" * 120_000
    assert main(["pin", "--model", long]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "(120000 characters)" in err and len(err) < 1000
    assert main(["patch", "apply", "--model", "../../x"]) == ExitCode.USAGE
    assert "invalid model name" in capsys.readouterr().err
    monkeypatch.setenv("PIPELINE_TAG_TEMPLATE", "{model.zzz}")
    for args in (["pin", "--model", MODEL], ["build", "--model", MODEL]):
        assert main(args) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert "tag_template" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    assert not (tmp_path / "locks").exists()


def test_a_failed_pin_leaves_no_run_directory_and_build_no_empty_table(
    world: BuildRepos, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pin", "--model", MODEL, "--atom", "no-such-branch"]) == ExitCode.SOURCE
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
    assert main(["pin", "--model", MODEL, "--atom", "no-such-branch", "--keep-failed-run"]) == ExitCode.SOURCE
    assert len(list((tmp_path / "runs").iterdir())) == 1
    capsys.readouterr()
    assert main(["build", "--model", "No-Such-Model"]) == ExitCode.USAGE
    assert "stage  status" not in capsys.readouterr().err
