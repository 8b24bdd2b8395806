"""One lock verification everywhere a lock is read (issue 27 §2): each tampering is refused.

A final lock (after the patch stage) is edited one field at a time; `check --lock`,
`render --lock` and `build --lock` all refuse it with exit 12, the field's recorded and
actual values side by side, the lock file named and the repair command carrying `--lock F`.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline import labels
from pipeline.cli import main
from pipeline.config import load_settings
from pipeline.errors import ExitCode, LockInconsistent
from pipeline.lock import Lock
from pipeline.log import Logger
from pipeline.oci.engine import ImageInfo
from pipeline.stages.base import Context
from pipeline.stages.verify import verify_here
from tests.fixtures.build_repos import MODEL, BuildRepos
from tests.fixtures.project import only_run, run_until, states


def _final_lock(tmp_path: Path) -> Path:
    lock = tmp_path / "given.toml"
    shutil.copy(run_until("patch", tmp_path) / "lock.toml", lock)
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
    world: BuildRepos,
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
    world: BuildRepos,
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
    world: BuildRepos,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = run_until("check", tmp_path)
    lock = run / "lock.toml"
    lock.write_text(EDITS["patch-sha256"][1](lock.read_text(), world))
    capsys.readouterr()
    assert main(["build", "--resume", str(run), "--until", "render"]) == ExitCode.LOCK_INCONSISTENT
    assert f"lock file {lock} changed after the patch stage" in capsys.readouterr().err
    render = json.loads((run / "stages" / "render.json").read_text())
    assert render["status"] == "failed"
    assert not (run / "context").exists()


def _ctx(cache: Path) -> tuple[Context, io.StringIO]:
    out = io.StringIO()
    settings = load_settings(env={**os.environ, "PIPELINE_CACHE_DIR": str(cache)}, cwd=Path.cwd())
    return Context(settings=settings, log=Logger(stream=out), env={}, work_dir=cache), out


@pytest.mark.parametrize("case", ["patch-sha256", "atom-sha"])
def test_smoke_and_tag_verify_the_run_lock_where_the_mirrors_are_and_say_so_where_they_are_not(
    case: str,
    world: BuildRepos,
    tmp_path: Path,
) -> None:
    """`verify_here` (smoke and tag of a run): the one `verify_lock` on a host with the mirrors; on a
    GPU host without them, one line saying the lock is bound by digest only, and no verification."""
    lock = _final_lock(tmp_path)
    here, _ = _ctx(tmp_path / "cache")  # the build host: the run's mirrors
    assert verify_here(here, lock, lock_given=False, stage="smoke") is True
    field, edit = EDITS[case]
    lock.write_text(edit(lock.read_text(), world))
    with pytest.raises(LockInconsistent) as e:
        verify_here(here, lock, lock_given=False, stage="tag")
    assert field in str(e.value) and f"lock file {lock} is inconsistent" in str(e.value)

    gpu, out = _ctx(tmp_path / "gpu-host-cache")  # no mirrors there
    assert verify_here(gpu, lock, lock_given=False, stage="smoke") is False
    said = out.getvalue()
    assert said.count("\n") == 1, said
    assert f"smoke: no mirrors of ATOM and aiter on this host ({tmp_path / 'gpu-host-cache'})" in said
    assert f"the lock {lock} is not verified against its commits here" in said


class _Engine:
    """The GPU host's engine, holding the image the run built from the lock (its pair label)."""

    docker_host = None

    def __init__(self, image: str, pair_digest: str) -> None:
        self.info = ImageInfo("sha256:" + "1" * 64, [], [image], {labels.PAIR_DIGEST: pair_digest}, "")
        self.image_ref = image

    def image(self, ref: str) -> ImageInfo | None:
        return self.info if ref == self.image_ref else None

    def close(self) -> None:
        pass


def test_the_smoke_and_tag_stages_refuse_a_lock_edited_after_the_build_before_anything_starts(
    world: BuildRepos,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU host without mirrors: the run's lock is still the image's (its pair label), or nothing
    is started (exit 12); with the mirrors, smoke and tag name the edited field first."""
    import pipeline.release.tag
    import pipeline.smoke
    from pipeline.stages import smoke, tag

    lock = _final_lock(tmp_path)
    image = "127.0.0.1:5000/rocm/atom-dev@sha256:" + "2" * 64
    engine = _Engine(image, Lock.load(lock).pair_digest())
    monkeypatch.setattr(Context, "engine", lambda self, host=None: engine)
    called: list[str] = []
    monkeypatch.setattr(pipeline.smoke, "run_smoke", lambda *a, **kw: called.append("smoke"))
    monkeypatch.setattr(pipeline.release.tag, "tag_verified", lambda *a, **kw: called.append("tag"))
    lock.write_text(EDITS["patch-sha256"][1](lock.read_text(), world))
    recipe = world.recipe
    smoke_in = smoke.Inputs(image=image, model=MODEL, recipe=recipe, out_dir=tmp_path / "smoke", lock=lock)
    tag_in = tag.Inputs(
        image=image, verdict=tmp_path / "smoke", lock=lock, recipe=recipe, registry="127.0.0.1:5000",
        tag=load_settings(env=dict(os.environ), cwd=tmp_path).tag, release=tmp_path / "locks", model=MODEL,
    )  # fmt: skip
    here, _ = _ctx(tmp_path / "cache")  # with the run's mirrors: the field that was edited
    for stage, inputs in ((smoke, smoke_in), (tag, tag_in)):
        with pytest.raises(LockInconsistent) as e:
            stage.run(here, inputs)  # type: ignore[attr-defined]
        assert f"lock file {lock} is inconsistent" in str(e.value) and ".sha256" in str(e.value)
    gpu, out = _ctx(tmp_path / "gpu")  # no mirrors: said, and the lock is not the image's
    with pytest.raises(LockInconsistent) as e:
        smoke.run(gpu, smoke_in)
    assert f"lock file {lock} is not the lock the image {image} was built from" in str(e.value)
    assert "nothing was started" in str(e.value)
    # tag without mirrors: release.tag.check_binding binds the lock to the image's pair before any
    # push (tests/unit/test_tag.py, and tests/docker/test_two_hosts.py on a real registry)
    assert "no mirrors of ATOM and aiter on this host" in out.getvalue()
    assert called == []
