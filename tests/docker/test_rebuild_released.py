"""What the plan calls released is what the registry's moving tag holds (issue 29): a CI runner has no
locks/ of the last run, so `locks/<model>.released.json` cannot carry it from one nightly to the next.

A real registry (docker-registry, no auth): the image `{model}-verified` points at carries the
inputs-digest label. Its model is neither built nor smoked; another inputs digest there is built.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import requests

from pipeline import labels
from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.oci.registry import MEDIA_DOCKER_MANIFEST, RegistryClient
from tests.docker.conftest import Registry
from tests.fixtures.reach_repos import ReachRepos, build_reach_repos, recipe_yaml
from tests.git.test_rebuild_plan import _env

REPOSITORY = "rocm/atom-dev"  # [image] repository's default


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> ReachRepos:
    return build_reach_repos(tmp_path_factory.mktemp("released"))


def _blob(reg: Registry, body: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    start = requests.post(f"{reg.url}/v2/{REPOSITORY}/blobs/uploads/", timeout=30)
    assert start.status_code == 202, start.text
    where = start.headers["Location"]
    where = where if where.startswith("http") else reg.url + where
    put = requests.put(
        where + ("&" if "?" in where else "?") + f"digest={digest}",
        data=body,
        headers={"Content-Type": "application/octet-stream"},
        timeout=30,
    )
    assert put.status_code == 201, put.text
    return digest


def _release(reg: Registry, tag: str, inputs_digest: str) -> None:
    """An image whose config carries the inputs-digest label, at `tag` (as `pipeline tag` leaves it)."""
    config = json.dumps(
        {"architecture": "amd64", "os": "linux", "config": {"Labels": {labels.INPUTS_DIGEST: inputs_digest}}}
    )
    layer = b"not a real layer"
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_DOCKER_MANIFEST,
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": len(config),
            "digest": _blob(reg, config.encode()),
        },
        "layers": [
            {
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "size": len(layer),
                "digest": _blob(reg, layer),
            }
        ],
    }
    RegistryClient(reg.host).put_manifest(
        REPOSITORY, tag, json.dumps(manifest).encode(), MEDIA_DOCKER_MANIFEST
    )


def test_a_model_whose_verified_tag_holds_its_inputs_digest_is_neither_built_nor_smoked(
    fx: ReachRepos, registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(fx, tmp_path, monkeypatch)
    (tmp_path / "recipes" / "Alpha.yaml").unlink()  # Gamma and Beta: both compatible at the heads
    (tmp_path / "recipes" / "Beta.yaml").write_text(recipe_yaml("Beta", "GammaForCausalLM"))
    assert main(["rebuild", "--write-plan", str(tmp_path / "first")]) == ExitCode.OK  # no registry
    first = json.loads((tmp_path / "first" / "plan.json").read_text())
    assert first["matrix"]["released"] == [] and sorted(first["matrix"]["smoke"]) == ["Beta", "Gamma"]
    gamma = first["models"]["Gamma"]["inputs_digest"]
    _release(registry, "Gamma-verified", gamma)  # Gamma's image was verified and tagged
    _release(registry, "Beta-verified", "0" * 64)  # Beta's last release was of other inputs

    monkeypatch.setenv("PIPELINE_REGISTRY", registry.host)
    assert main(["rebuild", "--write-plan", str(tmp_path / "next")]) == ExitCode.OK
    plan = json.loads((tmp_path / "next" / "plan.json").read_text())
    assert plan["models"]["Gamma"]["inputs_digest"] == gamma  # the same inputs as the first plan's
    assert plan["models"]["Gamma"]["released"] is True
    assert (
        f"{registry.host}/{REPOSITORY}:Gamma-verified holds inputs digest {gamma[:12]}"
        in (plan["models"]["Gamma"]["released_by"])
    )
    assert plan["models"]["Beta"]["released"] is False
    assert plan["matrix"]["released"] == ["Gamma"]
    assert plan["matrix"]["smoke"] == ["Beta"]
    assert [b["models"] for b in plan["builds"]] == [["Beta"]]
    assert not (tmp_path / "locks").exists()  # no released.json anywhere: the registry said it
