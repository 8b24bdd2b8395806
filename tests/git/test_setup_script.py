"""scripts/setup.sh's production steps: the image wheelhouse is the one the configuration names."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from pipeline.config import load_settings
from pipeline.toolpins import WHEELHOUSE_REQUIREMENTS

ROOT = Path(__file__).resolve().parents[2]


def _setup(step: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    base.update(PYTHON=sys.executable, PIPELINE_CACHE_DIR=str(tmp_path / "cache"), **env)
    return subprocess.run(
        ["bash", str(ROOT / "scripts/setup.sh"), step],
        cwd=ROOT, env=base, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_image_wheelhouse_is_for_the_configured_python_in_the_configured_directory(
    tmp_path: Path,
) -> None:
    # A python this host cannot have: the step names the configured version and stops, before
    # downloading anything for the wrong python.
    got = _setup("image-wheelhouse", tmp_path, PIPELINE_PYTHON_VERSION="3.99")
    assert got.returncode == 1, got.stdout + got.stderr
    wheels = tmp_path / "cache" / "wheels" / "py3.99"
    assert f"[image] python_version = 3.99, [paths] wheels_dir = {wheels}" in got.stdout
    assert "python 3.99 ([image] python_version) is needed" in got.stderr
    assert not wheels.exists()


def test_a_complete_wheelhouse_where_render_reads_it_is_kept(tmp_path: Path) -> None:
    host = f"{sys.version_info[0]}.{sys.version_info[1]}"
    wheels = tmp_path / "elsewhere"  # [paths] wheels_dir, as render reads it
    wheels.mkdir()
    digest = hashlib.sha256(("\n".join(WHEELHOUSE_REQUIREMENTS) + "\n").encode()).hexdigest()[:16]
    (wheels / ".complete").write_text(digest + "\n")
    env = {"PIPELINE_PYTHON_VERSION": host, "PIPELINE_WHEELS_DIR": str(wheels)}
    got = _setup("image-wheelhouse", tmp_path, **env)
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"wheelhouse: {wheels} is complete" in got.stdout
    assert load_settings(env=env).wheels_dir == wheels  # the directory render links from


def test_an_unknown_step_names_the_production_steps(tmp_path: Path) -> None:
    got = _setup("nonsense", tmp_path)
    assert got.returncode == 1 and "image-wheelhouse, venv, production" in got.stderr
