"""README step 6, two hosts (issue 27 §4, §5): a run started on a build host finishes on a GPU host.

The commands are the README's. Host A, the build host (a second dockerd: its own engine, cache and
runs), runs `pipeline build --model M --until build`: the candidate is pushed to the registry by
digest. Only the run directory travels, into the GPU host's runs directory; the candidate's tag in
the registry is then overwritten with another image. Host B, the GPU host, is the suite's dockerd
reached over `ssh://` (the real sshd), with its own cache: no mirrors, no build cache, nothing of
host A's. There, `pipeline build --resume runs/<run> --docker-host ssh://…`:

- refuses the run's lock edited (a patch's sha256, the ATOM SHA) between build and smoke and
  between smoke and tag, exit 12 each time, with nothing pushed or moved (the registry's tags read
  back), and once the edit is undone goes on as if it had not happened;
- smoke pulls the candidate by its digest (not by the moved tag), says it cannot verify the lock
  against its commits there (no mirrors) and binds it to the image; tag pushes that digest and
  moves the tags. Resumed again, nothing runs again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.oci.engine import Engine
from pipeline.oci.ref import parse_image_ref
from pipeline.oci.registry import RegistryClient
from tests.docker.conftest import DockerCleanup
from tests.docker.test_e2e import MODEL, World, runs, stage_status, world  # noqa: F401
from tests.fixtures.build_repos import TEST_BASE_PYTHON, test_wheelhouse
from tests.servers.sshd import Sshd

WHEELS = test_wheelhouse()  # read before a fixture points PIPELINE_CACHE_DIR elsewhere


def _release_tags(client: RegistryClient, repository: str) -> list[str]:
    """What a tag stage would push or move: the immutable and moving tags (the candidates are not)."""
    return [t for t in client.tags(repository) if t.startswith(MODEL)]


def _edit(lock: Path, old: str, new: str) -> str:
    text = lock.read_text()
    assert text.count(old) >= 1, old
    lock.write_text(text.replace(old, new))
    return text


def test_a_run_built_on_one_host_is_smoked_and_tagged_on_another_by_digest(
    world: World,  # noqa: F811
    engine: Engine,
    base_image: str,
    second_engine: tuple[Engine, str],
    sshd_host: Sshd,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # host A, the build host: `pipeline build --model M --until build`
    _, host_a = second_engine
    for key, value in {
        "DOCKER_HOST": host_a,
        "PIPELINE_WHEELS_DIR": str(WHEELS),
        "PIPELINE_PYTHON_VERSION": TEST_BASE_PYTHON,
        "PIPELINE_OFFLINE_BUILD": "1",  # the second dockerd's bridge has no way out
        "PIPELINE_REQUIRE_GIT": "0",
    }.items():
        monkeypatch.setenv(key, value)
    code = main(["build", "--model", MODEL, "--until", "build"])
    err = capsys.readouterr().err
    assert code == 0, err
    (run,) = runs(world)
    built = json.loads((run / "stages" / "build.json").read_text())["outputs"]
    candidate = built["candidate"]
    repo = f"{world.registry.host}/{world.repository}"
    assert candidate.startswith(f"{repo}@sha256:"), built
    assert candidate in err  # the summary names the candidate by digest
    tested = candidate.split("@", 1)[1]

    # only the run directory travels, into the GPU host's runs directory
    gpu_runs = tmp_path / "gpu-host" / "runs"
    moved = gpu_runs / run.name
    shutil.copytree(run, moved)
    # the candidate's tag in the registry now holds another image
    tag = parse_image_ref(built["pushed"]).tag
    assert tag is not None
    engine.tag(base_image, repo, tag)
    docker_cleanup.image(f"{repo}:{tag}")
    engine.push(repo, tag)
    client = RegistryClient(world.registry.host)
    assert client.manifest_digest(world.repository, tag) != tested

    # host B, the GPU host: its engine over ssh://, its own cache (no mirrors) and runs
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setenv("PATH", sshd_host.env_path)  # its `ssh` knows the host key and the client key
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "gpu-host" / "cache"))
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(gpu_runs))
    docker_cleanup.image(candidate)  # smoke pulls it onto the suite's engine, host B
    assert engine.image(candidate) is None  # nothing of host A's
    resume = ["build", "--resume", str(moved), "--docker-host", sshd_host.docker_host]
    lock = moved / "lock.toml"
    atom_sha = json.loads((moved / "stages" / "pin.json").read_text())["outputs"]["lock"]["sources"]["atom"]
    patch_sha = next(p["sha256"] for p in json.loads((moved / "stages" / "patch.json").read_text())["outputs"]
                     ["lock"]["patches"] if p["status"] == "applied")  # fmt: skip
    edits = {
        "a patch's sha256": (f'sha256 = "{patch_sha}"', 'sha256 = "' + "0" * 64 + '"'),
        "the ATOM SHA": (atom_sha["sha"], "1" * 40),
    }

    def refused(args: list[str], when: str) -> str:
        """Each edit of the run's lock refused (exit 12), nothing pushed or moved; then undone."""
        said = ""
        for what, (old, new) in edits.items():
            good = _edit(lock, old, new)
            code = main(args)
            err = capsys.readouterr().err
            lock.write_text(good)
            assert code == ExitCode.LOCK_INCONSISTENT, f"{what} edited {when}: exit {code}\n{err}"
            assert _release_tags(client, world.repository) == [], f"{what} edited {when}: pushed"
            said += err
        return said

    # the lock edited between build and smoke: render refuses it, on a host that cannot render
    err = refused(resume, "between build and smoke")
    assert f"lock file {lock} changed after the patch stage" in err
    assert engine.image(candidate) is None  # nothing was pulled or started

    # smoke, on host B
    code = main([*resume, "--until", "smoke"])
    err = capsys.readouterr().err
    assert code == 0, err
    for stage in ("pin", "patch", "check", "render", "build"):
        assert f"↷ {stage}" in err, err  # the undone edits left nothing to do again
    assert f"{candidate} is not on the engine; pulling it by digest" in err
    assert "smoke: no mirrors of ATOM and aiter on this host" in err
    verdict = json.loads((moved / "smoke" / "verdict.json").read_text())
    assert verdict["passed"] is True and verdict["image"]["digest"] == tested  # the digest it ran
    assert verdict["engine"] == sshd_host.docker_host

    # the lock edited between smoke and tag: refused by tag itself (--from tag), by render on a resume
    err = refused([*resume, "--from", "tag"], "before tag (--from tag)")
    assert f"lock file {lock} is not the lock the image" in err and "nothing was pushed or moved" in err
    assert "tag: no mirrors of ATOM and aiter on this host" in err
    err = refused(resume, "between smoke and tag")
    assert f"lock file {lock} changed after the patch stage" in err

    # the run finished on host B: tag pushes the smoke-tested digest, not the moved tag's
    code = main(resume)
    err = capsys.readouterr().err
    assert code == 0, err
    for stage in ("pin", "patch", "check", "render", "build", "smoke"):
        assert f"↷ {stage}" in err, err
    assert stage_status(moved) == dict.fromkeys(
        ("pin", "patch", "check", "render", "build", "smoke", "tag"), "ok"
    )
    tagged = json.loads((moved / "stages" / "tag.json").read_text())["outputs"]
    assert tagged["digest"] == tested
    assert client.manifest_digest(world.repository, f"{MODEL}-verified") == tested
    assert client.manifest_digest(world.repository, tag) != tested  # the moved tag, left as it is
    assert engine.image(tagged["ref"]) is None  # no local push tag

    # resumed once more (as after a kill once the tag was pushed): nothing runs again
    code = main(resume)
    err = capsys.readouterr().err
    assert code == 0, err
    for stage in ("pin", "patch", "check", "render", "build", "smoke", "tag"):
        assert f"↷ {stage}" in err, err
