"""pipeline.oci.registry against a real Debian docker-registry (distribution 2.8) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from pipeline.errors import InfraError
from pipeline.oci.engine import Engine
from pipeline.oci.registry import (
    MEDIA_DOCKER_MANIFEST,
    RegistryAuthError,
    RegistryClient,
    RegistryError,
    credentials_for,
    resolve_digest,
)

from .conftest import DockerCleanup, Registry


def _push(
    engine: Engine, base_image: str, cleanup: DockerCleanup, reg: Registry, tmp_path: Path
) -> tuple[str, str]:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "marker").write_text(uuid.uuid4().hex)
    (ctx / "Dockerfile").write_text(f"FROM {base_image}\nCOPY marker /marker\n")
    built = engine.build(ctx, tag=cleanup.tag("reg"), labels=cleanup.labels)
    repo = f"atom-pipeline-test/reg-{cleanup.case_id}"
    engine.tag(built.id, reg.repo(repo), "v1")
    cleanup.image(f"{reg.repo(repo)}:v1")
    return repo, engine.push(reg.repo(repo), "v1", auth_config=reg.auth_config)


def test_client_reads_and_moves_tags_without_pushing_layers(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup, registry: Registry, tmp_path: Path
) -> None:
    repo, digest = _push(engine, base_image, docker_cleanup, registry, tmp_path)
    client = RegistryClient(registry.host)
    client.ping()
    assert client.manifest_digest(repo, "v1") == digest
    assert client.manifest_digest(repo, "absent") is None
    body, media_type, got = client.get_manifest(repo, digest)
    assert got == digest and media_type == MEDIA_DOCKER_MANIFEST
    assert json.loads(body)["config"]["digest"].startswith("sha256:")
    assert client.tag_digest(repo, digest, "moved") == digest
    assert client.tags(repo) == ["moved", "v1"]
    assert resolve_digest(f"{registry.host}/{repo}:moved") == digest
    with pytest.raises(RegistryError, match="has no image"):
        resolve_digest(f"{registry.host}/{repo}:absent")


def test_client_against_a_stopped_registry(registry: Registry) -> None:
    registry.process.terminate()
    registry.process.wait(timeout=10)
    sleeps: list[float] = []
    with pytest.raises(InfraError) as e:
        RegistryClient(registry.host, retries=2, sleep=sleeps.append).manifest_digest("x", "y")
    assert sleeps == [0.5, 1.0] and "3 attempts" in str(e.value)
    assert resolve_digest(f"{registry.host}/x:y", timeout=2) is None


def test_client_basic_auth_and_credential_helper(
    engine: Engine,
    base_image: str,
    docker_cleanup: DockerCleanup,
    auth_registry: Registry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert auth_registry.username is not None and auth_registry.password is not None
    repo, digest = _push(engine, base_image, docker_cleanup, auth_registry, tmp_path)
    with pytest.raises(RegistryAuthError, match="needs credentials"):
        RegistryClient(auth_registry.host).manifest_digest(repo, "v1")
    wrong = "nope-" + auth_registry.password
    with pytest.raises(RegistryAuthError) as e:
        RegistryClient(auth_registry.host, credentials=(auth_registry.username, wrong)).manifest_digest(
            repo, "v1"
        )
    assert wrong not in f"{e.value} {e.value.evidence}"

    # credentials from a Docker credential helper (a stand-in binary on PATH)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    helper = bindir / "docker-credential-fake"
    helper.write_text(
        "#!/bin/sh\nread server\n"
        f'[ "$server" = "{auth_registry.host}" ] || exit 1\n'
        f'echo \'{{"Username": "{auth_registry.username}", "Secret": "{auth_registry.password}"}}\'\n'
    )
    helper.chmod(0o755)
    cfg = tmp_path / "docker"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"credHelpers": {auth_registry.host: "fake"}}))
    # docker.auth finds the helper on the process's PATH and runs it with `env`
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    env = {"PATH": os.environ["PATH"], "DOCKER_CONFIG": str(cfg)}
    creds = credentials_for(auth_registry.host, env)
    assert creds is not None and creds.username == auth_registry.username
    assert auth_registry.password not in repr(creds)
    client = RegistryClient(auth_registry.host, credentials=creds)
    assert client.manifest_digest(repo, "v1") == digest
    assert client.tag_digest(repo, digest, "verified") == digest
    assert credentials_for("other.example", env) is None
