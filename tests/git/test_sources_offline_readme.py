"""A newcomer's offline path, exactly as README.md's "Offline" section writes it.

A copy of the repository's tracked files stands for a fresh clone; the README's blocks are run
with bash as written, with only the placeholders a user would fill in replaced: the mirror paths
(fixture repositories shaped like the real ones, see `make_offline_mirrors`) and the digest.
The clone's own patch series targets the real ATOM, so it is swapped for one that fits the
fixture ATOM. There is no network: proxies point at a closed port, no Docker engine answers,
and every source is a local path.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.lock import Lock
from tests.fixtures.upstream_repos import Upstreams, free_port, make_offline_mirrors

ROOT = Path(__file__).resolve().parents[2]
MODEL = "MiniMax-M3-MXFP4"
DIGEST = "sha256:" + "5" * 64


def readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("<!-- offline:start", 1)[1].split("<!-- offline:end -->", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def fresh_clone(dest: Path, ups: Upstreams) -> Path:
    """The tracked files of this repository (what `git clone` gives), and a series for the fixture."""
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    series = dest / "patches" / "atom"
    shutil.rmtree(series)
    series.mkdir(parents=True)
    atom_main = ups.shas["atom_3"]
    work = dest.parent / "atom-edit"
    subprocess.run(["git", "clone", "-q", str(ups.atom.path), str(work)], check=True)
    model = work / "atom" / "models" / "minimax_m3.py"
    model.write_text(model.read_text().replace("class ", "# patched by the series\nclass ", 1))
    diff = subprocess.run(
        ["git", "diff", "--full-index"], cwd=work, capture_output=True, text=True, check=True
    ).stdout
    (series / "0001-comment.patch").write_text(
        "From: Fixture <fixture@example.invalid>\n"
        "Date: Thu, 25 Jun 2026 00:00:00 +0000\n"
        "Subject: minimax_m3: a comment (fixture)\n"
        "Origin: vendor\n"
        f"X-Atom-Range: {atom_main[:12]}..\n"
        "X-Patch-Version: 1\n"
        "\n"
        "A patch that applies to the fixture ATOM.\n"
        "---\n" + diff + "\n"
    )
    (series / "series").write_text("0001-comment.patch\n")
    return dest


def newcomer_env(tmp_path: Path, clone: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "pipeline"  # what `pip install -e .` would put on PATH
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m pipeline "$@"\n')
    shim.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    closed = f"http://127.0.0.1:{free_port()}"
    return {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "PYTHONPATH": str(clone),
        "LANG": "C.UTF-8",
        "http_proxy": closed,
        "https_proxy": closed,
        "HTTPS_PROXY": closed,
        "ALL_PROXY": closed,
        "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock",
        "GIT_CONFIG_NOSYSTEM": "1",
    }


def fill_in(block: str, ups: Upstreams) -> str:
    for placeholder, value in {
        "/srv/mirrors/ATOM": str(ups.atom.path),
        "/srv/mirrors/aiter": str(ups.aiter.path),
        "/srv/mirrors/composable_kernel": str(ups.ck.path),
        "sha256:DIGEST": DIGEST,
    }.items():
        block = block.replace(placeholder, value)
    assert "/srv/mirrors" not in block and "DIGEST" not in block  # every placeholder known
    return block


def run(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "umask 022\n" + script],  # a usual umask
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def ups(tmp_path: Path) -> Upstreams:
    return make_offline_mirrors(tmp_path)


def test_readme_offline_section_reaches_render_with_configuration(tmp_path: Path, ups: Upstreams) -> None:
    blocks = readme_blocks()
    assert len(blocks) == 2 and "pipeline render" in blocks[0]
    clone = fresh_clone(tmp_path / "clone", ups)
    done = run(fill_in(blocks[0], ups), clone, newcomer_env(tmp_path, clone))
    assert done.returncode == 0, done.stdout + done.stderr

    lock = Lock.load(clone / "locks" / f"{MODEL}.toml")
    assert lock.atom.sha == ups.shas["atom_3"] and lock.aiter.sha == ups.shas["aiter_split"]
    assert lock.base_image.digest == DIGEST and [p.status for p in lock.patches] == ["applied"]
    assert lock.aiter.submodules[0].url == "https://github.com/ROCm/composable_kernel.git"
    dockerfile = (clone / "context" / "Dockerfile").read_text()
    assert DIGEST in dockerfile
    context = clone / "context"
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (context, context / "Dockerfile")}
    modes["lock"] = stat.S_IMODE((clone / "locks" / f"{MODEL}.toml").stat().st_mode)
    assert modes == {"context": 0o755, "Dockerfile": 0o644, "lock": 0o644}  # the umask's, not 0700/0600
    assert "offline: submodule 3rdparty/composable_kernel" in done.stderr  # said once, with the way out
    assert "unreachable" not in done.stderr and "retrying" not in done.stderr  # nothing tried the network


README_BASE = "rocm/pytorch:rocm7.2.4_ubuntu22.04_py3.10_pytorch_release_2.10.0"


@pytest.mark.parametrize("base", [README_BASE, "registry.example/team/rocm-pytorch:7.2.4-py3.10"])
def test_readme_offline_flags_reach_render_without_configuration(
    tmp_path: Path, ups: Upstreams, base: str
) -> None:
    """The flags block alone, as written; also with a base image other than the packaged default
    (render takes the base from the lock, not from the configuration it no longer has)."""
    flags_block = readme_blocks()[1]
    assert "pipeline render" in flags_block and flags_block.count("--base-image") == 1
    clone = fresh_clone(tmp_path / "clone", ups)
    done = run(fill_in(flags_block, ups).replace(README_BASE, base), clone, newcomer_env(tmp_path, clone))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (clone / "pipeline.toml").exists()
    lock = Lock.load(clone / "locks" / f"{MODEL}.toml")
    assert lock.atom.sha == ups.shas["atom_3"] and lock.base_image.digest == DIGEST
    assert lock.base_image.pinned == f"{base}@{DIGEST}"
    assert f"FROM {base}@{DIGEST}" in (clone / "context" / "Dockerfile").read_text()
    assert "unreachable" not in done.stderr
    assert "base_image" not in done.stderr  # the packaged default is no contradiction: nothing to say
    # the image's python, not the host's: image-wheelhouse reads [image] python_version
    assert "scripts/setup.sh image-wheelhouse" in done.stderr
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", "context/Dockerfile"], cwd=ROOT)
    assert ignored.returncode == 0  # the README's `-o context` lands where .gitignore covers
