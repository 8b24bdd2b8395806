"""README step 6, two hosts (issue 27 §4, §5): a run started on a build host finishes on a GPU host.

Host A (the suite's engine) runs `pipeline build --model M --until build`: the candidate is pushed
to the registry by digest. Only the run directory travels (copied elsewhere); the candidate's tag
in the registry is then overwritten with another image. Host B (a second, empty dockerd) resumes:
nothing before smoke runs again, smoke pulls the candidate by its digest (not by the moved tag),
and tag pushes that digest and moves the tags. Resumed again, nothing runs again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.oci.engine import Engine
from pipeline.oci.ref import parse_image_ref
from pipeline.oci.registry import RegistryClient
from tests.docker.conftest import DockerCleanup
from tests.docker.test_e2e import MODEL, World, cleanup_built, runs, stage_status, world  # noqa: F401
from tests.fixtures.second_engine import second_dockerd


def test_a_run_built_on_one_host_is_smoked_and_tagged_on_another_by_digest(
    world: World,  # noqa: F811
    engine: Engine,
    base_image: str,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        code = main(["build", "--model", MODEL, "--until", "build"])
    finally:
        cleanup_built(engine, docker_cleanup, world)
    err = capsys.readouterr().err
    assert code == 0, err
    (run,) = runs(world)
    built = json.loads((run / "stages" / "build.json").read_text())["outputs"]
    candidate = built["candidate"]
    repo = f"{world.registry.host}/{world.repository}"
    assert candidate.startswith(f"{repo}@sha256:"), built
    assert candidate in err  # the summary names the candidate by digest

    # only the run directory travels
    moved = tmp_path / "gpu-host" / "runs" / run.name
    shutil.copytree(run, moved)
    # the candidate's tag in the registry now holds another image
    tag = parse_image_ref(built["pushed"]).tag
    assert tag is not None
    engine.tag(base_image, repo, tag)
    docker_cleanup.image(f"{repo}:{tag}")
    engine.push(repo, tag)
    client = RegistryClient(world.registry.host)
    assert client.manifest_digest(world.repository, tag) != candidate.split("@", 1)[1]

    with second_dockerd() as (host_b, b_host):
        assert host_b.image(candidate) is None  # an empty engine: nothing of host A's
        code = main(["build", "--resume", str(moved), "--docker-host", b_host])
        err = capsys.readouterr().err
        assert code == 0, err
        for stage in ("pin", "patch", "check", "render", "build"):
            assert f"↷ {stage}" in err, err
        assert f"{candidate} is not on the engine; pulling it by digest" in err
        assert stage_status(moved) == dict.fromkeys(
            ("pin", "patch", "check", "render", "build", "smoke", "tag"), "ok"
        )
        verdict = json.loads((moved / "smoke" / "verdict.json").read_text())
        assert verdict["passed"] is True
        assert verdict["image"]["digest"] == candidate.split("@", 1)[1]  # the digest it ran
        assert verdict["engine"] == b_host
        tagged = json.loads((moved / "stages" / "tag.json").read_text())["outputs"]
        assert tagged["digest"] == candidate.split("@", 1)[1]  # that digest, not the moved tag's
        assert client.manifest_digest(world.repository, f"{MODEL}-verified") == tagged["digest"]
        assert host_b.image(tagged["ref"]) is None  # no local push tag left behind

        # resumed once more (as after a kill once the tag was pushed): nothing runs again
        code = main(["build", "--resume", str(moved), "--docker-host", b_host])
        err = capsys.readouterr().err
        assert code == 0, err
        for stage in ("pin", "patch", "check", "render", "build", "smoke", "tag"):
            assert f"↷ {stage}" in err, err
