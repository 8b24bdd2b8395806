"""The buildx path of pipeline.oci.buildkit, against a stand-in `docker` (tests/fixtures/docker_standin.py).

buildx cannot be installed here (Debian bookworm packages none for its docker.io 20.10), so what
is tested is the command line we give it and what we do with what it writes back; the
DOCKER_BUILDKIT=1 path runs for real in the docker tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.image.provenance import record_attestations, write_build_attestations
from pipeline.oci import buildkit
from tests.fixtures.docker_standin import write_standin


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[buildkit.CliChoice, Path]:
    log = tmp_path / "standin.log"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    docker = write_standin(tmp_path / "bin")
    cli = buildkit.find_cli(str(docker), {"PATH": "/usr/bin:/bin", "STANDIN_LOG": str(log)})
    assert cli is not None and cli.buildx and cli.version == "27.1.1"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch AS base\n")
    return cli, ctx


def _calls(tmp_path: Path) -> list[list[str]]:
    lines = (tmp_path / "standin.log").read_text().splitlines()
    return [json.loads(line) for line in lines if json.loads(line)[:2] == ["buildx", "build"]]


def _flag(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def test_a_push_build_caches_in_the_registry_attests_and_reads_the_metadata(
    standin: tuple[buildkit.CliChoice, Path], tmp_path: Path
) -> None:
    cli, ctx = standin
    opts = buildkit.BuildxOptions(
        builder="remote-b",
        cache_to="reg.example/cache:buildcache-m",
        push="reg.example/atom:build-0123456789ab",
    )
    got = buildkit.build(
        cli, ctx, cache_from=["reg.example/cache:aiter-k", "reg.example/cache:buildcache-m"],
        secrets={"GIT_TOKEN": "s3cret"}, buildx=opts, env={"STANDIN_LOG": str(tmp_path / "standin.log")},
    )  # fmt: skip
    (argv,) = _calls(tmp_path)
    assert _flag(argv, "--builder") == ["remote-b"]
    assert _flag(argv, "--cache-from") == [
        "type=registry,ref=reg.example/cache:aiter-k",
        "type=registry,ref=reg.example/cache:buildcache-m",
    ]
    assert _flag(argv, "--cache-to") == ["type=registry,ref=reg.example/cache:buildcache-m,mode=max"]
    assert "--provenance=mode=max" in argv and "--sbom=true" in argv
    assert "--push" in argv and "--load" not in argv and _flag(argv, "-t") == [opts.push]
    assert _flag(argv, "--metadata-file") and "BUILDKIT_INLINE_CACHE=1" not in " ".join(argv)
    assert "s3cret" not in " ".join(argv)  # the secret reaches buildx through its environment only
    assert got.metadata["containerimage.digest"].startswith("sha256:")
    assert got.id == got.metadata["containerimage.config.digest"]  # pushed, not loaded
    assert got.steps == ["[aiter 1/1] RUN python3 setup.py develop", "[atom 1/1] RUN pip install -e ."]
    # The record links the attestations where buildx pushed them, instead of saying null.
    ref = f"reg.example/atom@{got.metadata['containerimage.digest']}"
    statement = {"subject": [{"digest": {"sha256": "ab" * 32}}]}
    att = write_build_attestations(
        tmp_path, builder="buildx", unsupported="", statement=statement,
        attested={"ref": ref, "metadata": got.metadata},
    )  # fmt: skip
    record = record_attestations(att, "sha256:" + "ab" * 32)
    assert record["slsa_provenance"] == {"ref": ref, "mode": "max"}
    assert record["sbom"] == {"ref": ref, "format": "spdx"}
    assert record["build_provenance"] is not None


def test_without_a_registry_the_image_is_loaded_and_aiters_stage_is_built_for_its_cache_only(
    standin: tuple[buildkit.CliChoice, Path], tmp_path: Path
) -> None:
    cli, ctx = standin
    env = {"STANDIN_LOG": str(tmp_path / "standin.log")}
    stage = buildkit.BuildxOptions(cache_to="reg.example/cache:aiter-k", attest=False, load=False)
    buildkit.build(cli, ctx, target="aiter", cache_from=["reg.example/cache:aiter-k"], buildx=stage, env=env)
    loaded = buildkit.build(cli, ctx, tag="atom:candidate-1", buildx=buildkit.BuildxOptions(), env=env)
    aiter_call, load_call = _calls(tmp_path)
    assert _flag(aiter_call, "--target") == ["aiter"]
    assert _flag(aiter_call, "--cache-to") == ["type=registry,ref=reg.example/cache:aiter-k,mode=max"]
    assert not {"--push", "--load", "--provenance=mode=max"} & set(aiter_call)
    assert "--builder" not in load_call  # the CLI's current builder
    assert "--load" in load_call and _flag(load_call, "-t") == ["atom:candidate-1"]
    assert loaded.id.startswith("sha256:")


def test_buildx_options_on_a_cli_without_buildx_are_refused(tmp_path: Path) -> None:
    cli = buildkit.CliChoice("/usr/bin/docker", "20.10.24", buildx=False)
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(buildkit.BuildError, match="has no buildx plug-in"):
        buildkit.build(cli, tmp_path, buildx=buildkit.BuildxOptions())
