"""Issue 26's hostile inputs, run as a user runs them: `python -m pipeline` in its own process.

Each process is capped at 1 GiB of address space, so that a regression (reading /dev/zero,
expanding an alias bomb) fails here with a MemoryError instead of taking the host's memory.
The outcomes are the rows of docs/faults.md.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_RECIPE = REPO / "tests" / "servers" / "recipe-test.yaml"
CAP = 1 << 30


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def pipeline(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    clean.update(
        {
            "PIPELINE_CACHE_DIR": str(tmp_path / "cache"),
            "PIPELINE_RUNS_DIR": str(tmp_path / "runs"),
            "PIPELINE_LOCKS_DIR": str(tmp_path / "locks"),
            "PYTHONPATH": str(REPO),
            **(env or {}),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        preexec_fn=_cap,
        timeout=300,
    )


def _recipe(tmp_path: Path, old: str, new: str) -> Path:
    text = TEST_RECIPE.read_text()
    assert old in text
    path = tmp_path / "recipe.yaml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["check", "--lock", "/dev/zero"], 3, "lock file /dev/zero is not a regular file"),
        (["smoke", "--image", "x", "--recipe", "/dev/zero"], 2, "recipe /dev/zero is not a regular file"),
        (["--config", "/dev/zero", "check", "--lock", "x.toml"], 2, "/dev/zero is not a regular file"),
    ],
)
def test_a_device_given_as_a_file_is_refused_at_once(
    tmp_path: Path, args: list[str], code: int, said: str
) -> None:
    res = pipeline(tmp_path, *args)
    assert res.returncode == code, res.stderr
    assert said in res.stderr and "Traceback" not in res.stderr


def test_a_recipe_asking_for_the_push_password_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = _recipe(tmp_path, "secrets: [HF_TOKEN]", "secrets:\n  - HF_TOKEN\n  - PIPELINE_REGISTRY_PASSWORD")
    line = path.read_text().splitlines().index("  - PIPELINE_REGISTRY_PASSWORD") + 1
    res = pipeline(
        tmp_path,
        *("smoke", "--image", "x", "--recipe", str(path)),
        env={"PIPELINE_REGISTRY_PASSWORD": "s3cr3t-push-password"},
    )
    assert res.returncode == 2, res.stderr
    assert f"{path}:{line}: secrets[1]: PIPELINE_REGISTRY_PASSWORD" in res.stderr
    assert "s3cr3t" not in res.stderr + res.stdout
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_recipe_alias_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + k)}: &{chr(98 + k)} [" + ", ".join([f"*{chr(97 + k)}"] * 9) + "]\n" for k in range(12)
    )
    (tmp_path / "bomb.yaml").write_text(bomb)
    res = pipeline(tmp_path, "smoke", "--image", "x", "--recipe", str(tmp_path / "bomb.yaml"))
    assert res.returncode == 2, res.stderr
    assert "bomb.yaml:2: YAML alias *a refused" in res.stderr


def test_gpu_archs_outside_the_grammar_is_refused(tmp_path: Path) -> None:
    res = pipeline(tmp_path, "check", "--lock", "x.toml", env={"PIPELINE_GPU_ARCHS": "gfx950;$(id)"})
    assert res.returncode == 2, res.stderr
    assert "gpu_archs" in res.stderr and "gfx names separated by ';'" in res.stderr
