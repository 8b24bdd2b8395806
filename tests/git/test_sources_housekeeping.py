"""What the tool leaves on disk: no lock file per URL tried, modes that follow the umask, one pin
per lock file at a time, and `pipeline gc` for the rest."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import retry, sources
from pipeline.cli import main
from pipeline.config import load_settings
from pipeline.errors import ExitCode, InfraError, SourceError
from pipeline.lock import guard_path
from pipeline.sources import mirror_path, open_mirror
from tests.fixtures.upstream_repos import Upstreams, free_port, make_upstreams

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "1" * 64
MODEL = "MiniMax-M3-MXFP4"


@pytest.fixture
def ups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Upstreams:
    monkeypatch.setattr(retry, "BACKOFF_SECONDS", 0.01)
    monkeypatch.setattr(sources.pinning, "default_digest_resolver", lambda ref, env=None: None)
    for name in list(os.environ):
        if name.startswith(("PIPELINE_", "GITHUB_")):
            monkeypatch.delenv(name)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIPELINE_FETCH_RETRIES", "0")
    monkeypatch.setenv("PIPELINE_RECIPES_DIR", str(ROOT / "recipes"))  # pin refuses a model without one
    return make_upstreams(tmp_path)


def pin_args(ups: Upstreams, *extra: str) -> list[str]:
    return ["pin", "--model", MODEL, "--atom-repo", ups.atom.url, "--aiter-repo", ups.aiter.url,
            "--base-image", "base/img:1@" + DIGEST, *extra]  # fmt: skip


def test_urls_that_gave_no_mirror_leave_no_lock_file(tmp_path: Path) -> None:
    settings = load_settings(env={}, cwd=tmp_path, overrides={"cache_dir": str(tmp_path / "cache")})
    hostile = [
        f"git://127.0.0.1:{free_port()}/x;rm -rf ~",
        f"git://127.0.0.1:{free_port()}/$(touch pwned)",
        str(tmp_path / "not-a-repo"),
    ]
    (tmp_path / "not-a-repo").mkdir()
    for url in hostile:
        with pytest.raises((SourceError, InfraError)):
            open_mirror(settings, url, retries=0)
    assert not settings.mirrors_dir.exists() or list(settings.mirrors_dir.iterdir()) == []
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_pin_writes_files_with_the_umask_and_keeps_a_rewritten_locks_mode(ups: Upstreams) -> None:
    old = os.umask(0o022)
    try:
        assert main(pin_args(ups)) == 0
        lock = Path("locks") / f"{MODEL}.toml"
        assert stat.S_IMODE(lock.stat().st_mode) == 0o644  # readable by the team, as meant
        lock.chmod(0o664)
        assert main(pin_args(ups, "--atom", ups.shas["atom_1"])) == 0  # rewritten
        assert stat.S_IMODE(lock.stat().st_mode) == 0o664
        assert not guard_path(lock).exists()
    finally:
        os.umask(old)


def test_a_second_pin_of_the_same_lock_is_refused_with_exit_13(
    ups: Upstreams, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(pin_args(ups)) == 0
    lock = Path("locks") / f"{MODEL}.toml"
    before = lock.read_text()
    # another pin holds the lock file: a separate process, as two shells would be
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from pipeline.lock import updating\n"
         f"with updating(Path({str(lock.absolute())!r})):\n"
         "    print('holding', flush=True); time.sleep(60)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        capsys.readouterr()
        start = time.monotonic()
        assert main(pin_args(ups, "--atom", ups.shas["atom_1"])) == ExitCode.LOCKED
        assert time.monotonic() - start < 30  # refused, not left waiting
        assert "another `pipeline` run is updating lock file" in capsys.readouterr().err
        assert lock.read_text() == before  # the second pin wrote nothing
    finally:
        holder.kill()
        holder.wait()
    assert main(pin_args(ups, "--atom", ups.shas["atom_1"])) == 0  # free again


def test_gc_dry_run_lists_then_gc_removes_only_what_is_unused(
    ups: Upstreams, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(pin_args(ups)) == 0  # pins atom_2 / aiter head in refs/pins/
    settings = load_settings(env=dict(os.environ), cwd=Path.cwd())
    atom_mirror = mirror_path(settings, ups.atom.url)
    stale_sha = ups.shas["atom_1"]
    git_dir = f"--git-dir={atom_mirror}"
    subprocess.run(["git", git_dir, "update-ref", f"refs/pins/{stale_sha}", stale_sha], check=True)
    orphan = settings.mirrors_dir / "gone-1234567890.git.lock"
    orphan.write_text("")
    killed_clone = settings.mirrors_dir / f".{atom_mirror.name}.abc123.tmp"
    killed_clone.mkdir()
    old_run = Path(settings.paths.runs_dir) / "20200101-000000-pin-x-000000"
    old_run.mkdir(parents=True)
    (old_run / "pipeline.log").write_text("old\n")
    long_ago = time.time() - 90 * 86400
    os.utime(old_run / "pipeline.log", (long_ago, long_ago))
    os.utime(old_run, (long_ago, long_ago))
    capsys.readouterr()

    assert main(["gc", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"refs/pins/{stale_sha}" in out and str(orphan) in out and str(killed_clone) in out
    assert str(old_run) in out and "would remove 4 item(s)" in out
    assert orphan.exists() and killed_clone.exists() and old_run.exists()  # a dry run removes nothing

    assert main(["gc"]) == 0
    assert "removed 4 of 4 item(s)" in capsys.readouterr().out
    assert not orphan.exists() and not killed_clone.exists() and not old_run.exists()
    pins = subprocess.run(
        ["git", f"--git-dir={atom_mirror}", "for-each-ref", "--format=%(refname)", "refs/pins"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert pins == [f"refs/pins/{ups.shas['atom_2']}"]  # the one the lock names stays
    assert atom_mirror.is_dir() and main(pin_args(ups, "--offline")) == 0  # still usable offline
