"""A fetch killed midway (SIGKILL) leaves the mirror usable; the next fetch completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from pipeline.config import load_settings
from pipeline.sources import mirror_path, open_mirror, resolve_ref
from tests.fixtures.upstream_repos import make_upstreams

ROOT = Path(__file__).resolve().parents[2]

# Stands in for `git upload-pack` on the "remote" side, sending its output slowly
# (16 KiB every 10 ms) so the test can kill the fetch while the pack is arriving.
SLOW_UPLOAD_PACK = textwrap.dedent(
    """\
    #!{python}
    import os, subprocess, sys, time
    p = subprocess.Popen(["git", "upload-pack", *sys.argv[1:]], stdout=subprocess.PIPE)
    while True:
        chunk = os.read(p.stdout.fileno(), 16384)
        if not chunk:
            break
        os.write(1, chunk)
        time.sleep(0.01)
    sys.exit(p.wait())
    """
)


def test_sigkill_during_fetch_leaves_a_usable_mirror(tmp_path: Path) -> None:
    ups = make_upstreams(tmp_path)
    cache = tmp_path / "cache"
    settings = load_settings(env={}, cwd=tmp_path, overrides={"cache_dir": str(cache)})
    mirror = open_mirror(settings, ups.atom.url)
    old_main = ups.shas["atom_2"]
    ups.atom.git("config", "pack.window", "0")  # random data: skip the delta search, start sending at once
    new_main = ups.atom.add_big_commit(24, files=200)  # > fetch.unpackLimit: a real pack

    script = tmp_path / "slow-upload-pack"
    script.write_text(SLOW_UPLOAD_PACK.format(python=sys.executable))
    script.chmod(0o755)
    mirror.git("config", "remote.origin.uploadpack", str(script))

    code = (
        "from pathlib import Path; from pipeline.config import load_settings; "
        "from pipeline.sources import open_mirror; "
        f"open_mirror(load_settings(env={{}}, cwd=Path({str(tmp_path)!r}), "
        f"overrides={{'cache_dir': {str(cache)!r}}}), {ups.atom.url!r})"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        start_new_session=True,  # its own process group: git and upload-pack die with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pack_dir = mirror.path / "objects" / "pack"
    partial: list[Path] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            partial = [p for p in pack_dir.glob("tmp_pack_*") if p.stat().st_size > 1_000_000]
            if partial:
                break
            time.sleep(0.02)
        assert partial, "the fetch never started receiving the pack (or finished before it could be killed)"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    # killed midway: half a pack on disk, refs untouched, repository consistent
    assert any(p.exists() for p in partial)
    assert resolve_ref(mirror, "main", url="u").sha == old_main
    assert mirror.rev_parse(new_main) is None
    fsck = subprocess.run(
        ["git", f"--git-dir={mirror.path}", "fsck", "--no-dangling"], capture_output=True, text=True
    )
    assert fsck.returncode == 0, fsck.stderr

    # the next fetch (at normal speed) completes, with the mirror lock free again
    mirror.git("config", "--unset", "remote.origin.uploadpack")
    again = open_mirror(settings, ups.atom.url)
    assert again.path == mirror_path(settings, ups.atom.url)
    assert resolve_ref(again, "main", url="u").sha == new_main
    fsck = subprocess.run(
        ["git", f"--git-dir={again.path}", "fsck", "--no-dangling"], capture_output=True, text=True
    )
    assert fsck.returncode == 0, fsck.stderr
