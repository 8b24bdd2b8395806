"""Registry client against an in-memory v2 registry mounted as a requests transport (no sockets)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from pipeline.errors import ExitCode, InfraError, TagError, UsageError
from pipeline.oci.registry import (
    MEDIA_DOCKER_MANIFEST,
    MEDIA_OCI_INDEX,
    Credentials,
    ImageRef,
    RegistryAuthError,
    RegistryClient,
    RegistryError,
    credentials_for,
    default_scheme,
    parse_image_ref,
    resolve_digest,
    validate_tag,
)
from tests.fixtures.registry_fake import PASSWORD, USER, FakeRegistry, fake_session


def _client(fake: FakeRegistry, **kw: Any) -> RegistryClient:
    session = fake_session(fake)
    kw.setdefault("sleep", lambda s: None)
    return RegistryClient("127.0.0.1:5000", session=session, **kw)


MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": MEDIA_DOCKER_MANIFEST, "layers": []}).encode()


# ---------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("ubuntu", ImageRef("docker.io", "library/ubuntu")),
        ("ubuntu:22.04", ImageRef("docker.io", "library/ubuntu", "22.04")),
        ("rocm/pytorch:rocm7.2.4_py3.10", ImageRef("docker.io", "rocm/pytorch", "rocm7.2.4_py3.10")),
        ("docker.io/library/debian:12", ImageRef("docker.io", "library/debian", "12")),
        ("index.docker.io/rocm/atom", ImageRef("docker.io", "rocm/atom")),
        ("localhost/x", ImageRef("localhost", "x")),
        ("localhost:5000/x:1", ImageRef("localhost:5000", "x", "1")),
        ("127.0.0.1:5000/a/b/c:v", ImageRef("127.0.0.1:5000", "a/b/c", "v")),
        (
            "ghcr.io/rocm/atom-dev@sha256:" + "a" * 64,
            ImageRef("ghcr.io", "rocm/atom-dev", None, "sha256:" + "a" * 64),
        ),
        (
            "reg.example:443/r:t@sha256:" + "b" * 64,
            ImageRef("reg.example:443", "r", "t", "sha256:" + "b" * 64),
        ),
    ],
)
def test_parse_image_ref_normalises_like_docker(ref: str, expected: ImageRef) -> None:
    assert parse_image_ref(ref) == expected


def test_image_ref_str_round_trips() -> None:
    r = parse_image_ref("127.0.0.1:5000/atom/dev:MiniMax-verified")
    assert str(r) == "127.0.0.1:5000/atom/dev:MiniMax-verified"
    assert r.name == "127.0.0.1:5000/atom/dev" and r.reference == "MiniMax-verified"
    assert str(parse_image_ref("ubuntu")) == "docker.io/library/ubuntu"
    assert parse_image_ref("ubuntu").reference == "latest"


@pytest.mark.parametrize(
    "ref", ["", "Upper/Case", "repo:bad tag", "repo@sha256:short", "repo:-dash", "a//b", "repo:" + "x" * 129]
)
def test_parse_image_ref_rejects_invalid(ref: str) -> None:
    with pytest.raises(UsageError):
        parse_image_ref(ref)


@pytest.mark.parametrize(
    "tag", ["latest", "MiniMax-M3-MXFP4-20260629-atomab9eb78-aiter08f04b8-p1", "_x", "1.2.3"]
)
def test_validate_tag_accepts(tag: str) -> None:
    assert validate_tag(tag) == tag


@pytest.mark.parametrize("tag", ["", "-lead", ".dot", "has space", "sl/ash", "colon:x", "x" * 129, "ümlaut"])
def test_validate_tag_rejects_and_names_the_tag(tag: str) -> None:
    with pytest.raises(UsageError) as e:
        validate_tag(tag)
    assert f"'{tag}'" in str(e.value) and e.value.exit_code == ExitCode.USAGE


def test_default_scheme_http_only_for_loopback() -> None:
    assert default_scheme("127.0.0.1:5000") == "http"
    assert default_scheme("127.3.4.5") == "http"
    assert default_scheme("localhost:5000") == "http"
    assert default_scheme("[::1]:5000") == "http"
    assert default_scheme("ghcr.io") == "https"
    assert default_scheme("10.0.0.1:5000") == "https"


# ---------------------------------------------------------------- credentials


def test_credentials_from_env_first(tmp_path: Path) -> None:
    env = {"PIPELINE_REGISTRY_USER": "u1", "PIPELINE_REGISTRY_PASSWORD": "p1-secret", "REGISTRY_USER": "u2"}
    c = credentials_for("ghcr.io", env, tmp_path / "none.json")
    assert c is not None and tuple(c) == ("u1", "p1-secret")
    assert "p1-secret" not in repr(c) and "p1-secret" not in str(c)
    c2 = credentials_for(
        "ghcr.io", {"REGISTRY_USER": "u2", "REGISTRY_PASSWORD": "p2"}, tmp_path / "none.json"
    )
    assert c2 is not None and tuple(c2) == ("u2", "p2")


def test_credentials_from_docker_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    auth = base64.b64encode(b"bob:hunter2:with:colons").decode()
    hub = base64.b64encode(b"hubuser:hubpass").decode()
    cfg.write_text(
        json.dumps(
            {"auths": {"http://127.0.0.1:5000": {"auth": auth}, "https://index.docker.io/v1/": {"auth": hub}}}
        )
    )
    c = credentials_for("127.0.0.1:5000", {}, cfg)
    assert c is not None and tuple(c) == ("bob", "hunter2:with:colons") and c.source == str(cfg)
    hubc = credentials_for("docker.io", {}, cfg)
    assert hubc is not None and hubc.username == "hubuser"
    assert credentials_for("ghcr.io", {}, cfg) is None
    # DOCKER_CONFIG points at the directory
    assert credentials_for("127.0.0.1:5000", {"DOCKER_CONFIG": str(tmp_path)}) == c


def test_credentials_bad_docker_config_entry_does_not_echo_it(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"auths": {"r.example": {"auth": "bm90LWEtcGFpcg=="}}}))  # "not-a-pair"
    with pytest.raises(UsageError) as e:
        credentials_for("r.example", {}, cfg)
    assert "bm90LWEtcGFpcg" not in str(e.value) and "not-a-pair" not in str(e.value)


def test_client_repr_hides_password() -> None:
    c = RegistryClient("127.0.0.1:5000", credentials=(USER, PASSWORD))
    assert PASSWORD not in repr(c) and USER in repr(c)


# ---------------------------------------------------------------- manifests


def test_manifest_digest_get_put_and_tag_digest() -> None:
    fake = FakeRegistry()
    d = fake.add("atom/dev", "v1", MANIFEST)
    c = _client(fake)
    assert c.manifest_digest("atom/dev", "v1") == d
    assert c.manifest_digest("atom/dev", "missing") is None
    body, media, got = c.get_manifest("atom/dev", d)
    assert (body, media, got) == (MANIFEST, MEDIA_DOCKER_MANIFEST, d)
    assert c.tag_digest("atom/dev", d, "MiniMax-verified") == d
    assert fake.tags["atom/dev"]["MiniMax-verified"] == d
    assert c.tags("atom/dev") == ["MiniMax-verified", "v1"]
    assert c.tags("nope") == []
    accept = [m for m in fake.log if m[0] == "HEAD"]
    assert accept  # HEAD was used for the digest lookup


def test_manifest_digest_falls_back_to_hashing_the_body() -> None:
    fake = FakeRegistry(send_digest_on_head=False)
    d = fake.add("r", "t", MANIFEST, MEDIA_OCI_INDEX)
    assert _client(fake).manifest_digest("r", "t") == d


def test_get_manifest_missing_is_a_tag_error_naming_it() -> None:
    with pytest.raises(RegistryError) as e:
        _client(FakeRegistry()).get_manifest("r", "nope")
    assert "127.0.0.1:5000/r:nope" in str(e.value) and e.value.exit_code == ExitCode.TAG


def test_get_manifest_detects_corrupt_body() -> None:
    fake = FakeRegistry()
    d = fake.add("r", "t", MANIFEST)
    fake.blobs[d] = (MANIFEST + b" ", MEDIA_DOCKER_MANIFEST)
    with pytest.raises(RegistryError, match="hashes to"):
        _client(fake).get_manifest("r", d)


def test_put_manifest_validates_tag_before_any_request() -> None:
    fake = FakeRegistry()
    with pytest.raises(UsageError):
        _client(fake).put_manifest("r", "bad tag", MANIFEST, MEDIA_DOCKER_MANIFEST)
    assert fake.log == []


# ---------------------------------------------------------------- auth


def test_basic_auth_challenge() -> None:
    fake = FakeRegistry(auth="basic")
    d = fake.add("r", "t", MANIFEST)
    c = _client(fake, credentials=(USER, PASSWORD))
    assert c.manifest_digest("r", "t") == d
    assert c.manifest_digest("r", "t") == d
    # one 401, then Basic on every request (remembered)
    assert [m[2].split(" ")[0] for m in fake.log] == ["", "Basic", "Basic"]


def test_bearer_token_flow_per_scope() -> None:
    fake = FakeRegistry(auth="bearer")
    d = fake.add("r", "t", MANIFEST)
    c = _client(fake, credentials=(USER, PASSWORD))
    assert c.manifest_digest("r", "t") == d
    c.tag_digest("r", d, "moved")
    scopes = [q.get("scope", [""])[0] for q in fake.token_requests]
    assert scopes == ["repository:r:pull", "repository:r:pull,push"]
    assert all(q["service"] == ["fake"] for q in fake.token_requests)


def test_auth_needed_without_credentials() -> None:
    fake = FakeRegistry(auth="basic")
    fake.add("r", "t", MANIFEST)
    with pytest.raises(RegistryAuthError) as e:
        _client(fake).manifest_digest("r", "t")
    assert "needs credentials" in str(e.value) and "PIPELINE_REGISTRY_USER" in str(e.value)


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_wrong_credentials_refused_without_echoing_them(auth: str) -> None:
    fake = FakeRegistry(auth=auth)
    fake.add("r", "t", MANIFEST)
    wrong = "Wr0ng-pa55word"
    with pytest.raises(RegistryAuthError) as e:
        _client(fake, credentials=Credentials(USER, wrong, "env PIPELINE_REGISTRY_USER")).manifest_digest(
            "r", "t"
        )
    text = f"{e.value} {e.value.evidence or ''} {e.value!r}"
    assert wrong not in text and "refused the credentials" in str(e.value)
    assert "env PIPELINE_REGISTRY_USER" in str(e.value)


# ---------------------------------------------------------------- retries


def test_transient_errors_are_retried_with_backoff() -> None:
    fake = FakeRegistry()
    d = fake.add("r", "t", MANIFEST)
    fake.fail = [requests.ConnectionError("Connection refused"), 503, 429]
    sleeps: list[float] = []
    notes: list[str] = []
    c = _client(fake, retries=3, backoff=0.25, sleep=sleeps.append, on_retry=notes.append)
    assert c.manifest_digest("r", "t") == d
    assert sleeps == [0.25, 0.5, 1.0]
    assert len(notes) == 3 and "HTTP 503" in notes[1]


def test_retries_are_bounded_then_infra_error() -> None:
    fake = FakeRegistry()
    fake.fail = [requests.ConnectionError("Connection refused")] * 10
    sleeps: list[float] = []
    with pytest.raises(InfraError) as e:
        _client(fake, retries=2, sleep=sleeps.append).manifest_digest("r", "t")
    assert len(fake.log) == 3 and len(sleeps) == 2
    assert e.value.exit_code == ExitCode.INFRA and "3 attempts" in str(e.value)


def test_refusals_are_not_retried() -> None:
    fake = FakeRegistry()
    fake.fail = [400]
    with pytest.raises(TagError) as e:
        _client(fake, retries=3).manifest_digest("r", "t")
    assert len(fake.log) == 1 and "HTTP 400" in str(e.value)


# ---------------------------------------------------------------- resolve_digest


def test_resolve_digest_answers_and_passes_digests_through() -> None:
    fake = FakeRegistry()
    d = fake.add("atom", "v1", MANIFEST)
    assert resolve_digest("127.0.0.1:5000/atom:v1", session=fake_session(fake)) == d
    pinned = "rocm/pytorch@sha256:" + "c" * 64
    assert resolve_digest(pinned, session=fake_session(fake)) == "sha256:" + "c" * 64


def test_resolve_digest_none_when_nothing_answers() -> None:
    fake = FakeRegistry()
    fake.fail = [requests.ConnectionError("Name or service not known")] * 5
    assert resolve_digest("rocm/pytorch:latest", session=fake_session(fake)) is None
    assert fake.log[0][1] == "/v2/rocm/pytorch/manifests/latest"


def test_resolve_digest_missing_image_is_an_error() -> None:
    with pytest.raises(RegistryError, match="has no image"):
        resolve_digest("127.0.0.1:5000/atom:nope", session=fake_session(FakeRegistry()))


def test_resolve_digest_never_sends_push_credentials_from_env(tmp_path: Path) -> None:
    fake = FakeRegistry(auth="basic")
    fake.add("atom", "v1", MANIFEST)
    env = {"PIPELINE_REGISTRY_USER": USER, "PIPELINE_REGISTRY_PASSWORD": PASSWORD, "HOME": str(tmp_path)}
    with pytest.raises(RegistryAuthError):
        resolve_digest("127.0.0.1:5000/atom:v1", env=env, session=fake_session(fake))
