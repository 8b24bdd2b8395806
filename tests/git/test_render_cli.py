"""`pipeline pin` → `pipeline patch apply` → `pipeline render` through the CLI, on fixture repositories.

Render finds everything by itself here: the mirrors (pipeline.sources), aiter's
submodule mirror, and the patched ATOM commit (the series applied in the
mirror's object store by pipeline.patchq), which must match the lock.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import labels
from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.lock import Lock
from tests.fixtures.build_repos import (
    AITER_BUILD_CMD,
    ATOM_INSTALL_CMD,
    CK_PATH,
    MODEL,
    make_build_repos,
    write_series,
)

TEMPLATES = Path(__file__).resolve().parents[2] / "dockerfiles"
BASE = "atom-pipeline-test/bookworm-python3:1"
DIGEST = "sha256:" + "ab" * 32


def test_pin_patch_render_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repos = make_build_repos(tmp_path / "upstreams")
    series = write_series(repos, tmp_path / "patches")
    monkeypatch.chdir(tmp_path)
    env = {
        "PIPELINE_CACHE_DIR": str(tmp_path / "cache"),
        "PIPELINE_TEMPLATES_DIR": str(TEMPLATES),
        "PIPELINE_PATCHES_DIR": str(series),
        "PIPELINE_RECIPES_DIR": str(repos.recipe.parent),
        "PIPELINE_BASE_IMAGE": BASE,
        "PIPELINE_REPOSITORY": "atom-pipeline-test/atom",
        "PIPELINE_AITER_BUILD_CMD": AITER_BUILD_CMD,
        "PIPELINE_ATOM_INSTALL_CMD": ATOM_INSTALL_CMD,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pin = ["pin", "--model", MODEL, "--atom-repo", str(repos.atom), "--aiter-repo", str(repos.aiter)]
    assert main([*pin, "--base-image", f"{BASE}@{DIGEST}"]) == 0
    lock_path = tmp_path / "locks" / f"{MODEL}.toml"
    assert Lock.load(lock_path).base_image.digest == DIGEST
    capsys.readouterr()

    # no patch recorded yet, but the series applies one: that lock is not final, render refuses it
    assert main(["render", "--model", MODEL, "-o", "ctx0", "--json"]) == ExitCode.LOCK_INCONSISTENT
    assert "`pipeline patch apply --model " in capsys.readouterr().err
    assert not (tmp_path / "ctx0").exists()
    # with an empty series: the locked ATOM commit, unpatched, with the submodule from its mirror
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/series").write_text("")
    assert main(["render", "--model", MODEL, "-o", "ctx0", "--json", "--patches-dir", "empty"]) == 0
    out0 = json.loads(capsys.readouterr().out)
    assert "old-single-kv-cache" in (tmp_path / "ctx0/atom/atom/models/minimax_m3.py").read_text()
    assert (tmp_path / "ctx0/aiter" / CK_PATH / "include/ck.hpp").is_file()
    assert json.loads(out0["labels"][labels.PATCHES]) == []

    assert main(["patch", "apply", "--model", MODEL]) == 0
    capsys.readouterr()
    assert main(["render", "--model", MODEL, "-o", "ctx1", "--json"]) == 0
    out1 = json.loads(capsys.readouterr().out)
    assert "split-kv-cache" in (tmp_path / "ctx1/atom/atom/models/minimax_m3.py").read_text()
    patches = json.loads(out1["labels"][labels.PATCHES])
    assert [p["name"] for p in patches] == ["0001-minimax-m3-split-kv-cache.patch"]
    assert out1["inputs_digest"] != out0["inputs_digest"]

    # the series changed after `patch apply`: render refuses instead of building something unrecorded
    patch_file = series / "0001-minimax-m3-split-kv-cache.patch"
    patch_file.write_text(patch_file.read_text().replace("Fixture patch:", "Fixture patch, reworded:"))
    assert main(["render", "--model", MODEL, "-o", "ctx2"]) == ExitCode.LOCK_INCONSISTENT
    err = capsys.readouterr().err
    assert "pipeline patch apply" in err and ".sha256" in err
    assert Lock.load(lock_path).patches[0].sha256 in err  # recorded and actual, side by side
    assert not (tmp_path / "ctx2").exists()
