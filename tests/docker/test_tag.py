"""`pipeline tag` against a real engine and a real Debian docker-registry on 127.0.0.1."""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode, InfraError, TagError
from pipeline.log import Logger
from pipeline.oci.engine import Engine
from pipeline.oci.registry import Credentials, RegistryClient
from pipeline.release.tag import tag_verified
from tests.fixtures.tag_world import AITER_SHA, ATOM_SHA, CREATED, MODEL, World, make_world

from .conftest import REGISTRY_BIN, DockerCleanup, Registry

REPO_PREFIX = "atom-pipeline-test"


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the CLI from a scratch directory, with its cache and runs there; no registry secrets inherited."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in (
        "PIPELINE_REGISTRY_USER",
        "PIPELINE_REGISTRY_PASSWORD",
        "REGISTRY_USER",
        "REGISTRY_PASSWORD",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    return work


@dataclass
class Releases:
    """Candidates to release: each built FROM the local base with its world's labels, pushed as the
    candidate (what `pipeline build` does), with a passed verdict written for it by that digest."""

    engine: Engine
    base_image: str
    cleanup: DockerCleanup
    tmp_path: Path

    def repo(self, name: str) -> str:
        """This test's own repository in the registry."""
        return f"{REPO_PREFIX}/{name}-{self.cleanup.case_id}"

    def candidate(
        self,
        registry: Registry,
        repo: str,
        world_dir: str = "w",
        *,
        created: str = CREATED,
        finished: str | None = None,
    ) -> tuple[World, str]:
        """A new world (its image `created`, its verdict `finished` then) and the local name of its image."""
        world = make_world(self.tmp_path / world_dir, image_id="", created=created)
        if finished is not None:
            world.write_verdict(finished=finished)
        ctx = self.tmp_path / f"ctx-{uuid.uuid4().hex[:6]}"
        ctx.mkdir()
        (ctx / "marker").write_text(uuid.uuid4().hex)
        (ctx / "Dockerfile").write_text(f"FROM {self.base_image}\nCOPY marker /marker\n")
        ref = self.cleanup.tag(f"tagged-{uuid.uuid4().hex[:6]}")
        built = self.engine.build(ctx, tag=ref, labels={**world.labels, **self.cleanup.labels})
        candidate = f"candidate-{uuid.uuid4().hex[:12]}"
        self.engine.tag(built.id, registry.repo(repo), candidate)
        self.cleanup.image(f"{registry.repo(repo)}:{candidate}")
        digest = self.engine.push(registry.repo(repo), candidate, auth_config=registry.auth_config)
        world.write_verdict(
            image={"ref": f"{registry.repo(repo)}@{digest}", "id": built.id, "digest": digest}
        )
        return world, ref

    def next_day(self, registry: Registry, repo: str) -> tuple[World, str]:
        """A second candidate, made and smoke-tested a day after the first (`candidate()`'s defaults)."""
        return self.candidate(
            registry, repo, "b", created="2026-06-30T08:00:00Z", finished="2026-06-30T08:00:00+00:00"
        )


@pytest.fixture
def releases(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup, tmp_path: Path, cli_env: Path
) -> Releases:
    return Releases(engine, base_image, docker_cleanup, tmp_path)


def _tag_args(world: World, image: str, registry: Registry, repo: str, *extra: str) -> list[str]:
    return [
        "tag",
        "--image",
        image,
        "--verdict",
        str(world.verdict_path),
        "--lock",
        str(world.lock_path),
        "--registry",
        registry.host,
        "--repository",
        repo,
        *extra,
    ]


def _release_tags(client: RegistryClient, repo: str) -> list[str]:
    """The repository's tags but the candidates `Releases.candidate` pushed."""
    return [t for t in client.tags(repo) if not t.startswith("candidate-")]


def _immutable(world: World) -> str:
    from pipeline.release.tag import patchset_id

    return f"{MODEL}-20260629-atom{ATOM_SHA[:7]}-aiter{AITER_SHA[:7]}-p{patchset_id(world.lock)}"


def test_tag_pushes_by_digest_and_pulls_back(
    engine: Engine,
    releases: Releases,
    docker_cleanup: DockerCleanup,
    registry: Registry,
    capsys: pytest.CaptureFixture[str],
) -> None:
    repo = releases.repo("tag")
    world, image = releases.candidate(registry, repo)
    code = main(_tag_args(world, image, registry, repo, "--push-latest", "--json"))
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    immutable = _immutable(world)
    name = registry.repo(repo)
    assert result["immutable_ref"] == f"{name}:{immutable}" and result["pushed"] is True
    digest = result["digest"]
    assert result["moved"] == [f"{MODEL}-verified", "latest"]

    client = RegistryClient(registry.host)
    assert _release_tags(client, repo) == sorted([immutable, f"{MODEL}-verified", "latest"])
    for tag in (immutable, f"{MODEL}-verified", "latest"):
        assert client.manifest_digest(repo, tag) == digest
    assert digest == world.verdict()["image"]["digest"]  # the smoke-tested digest, PUT by the registry API

    # no local push tag is made (it would keep old images from being pruned)
    assert engine.image(f"{name}:{immutable}") is None
    # pull back by digest: same image, same labels
    built_id = world.verdict()["image"]["id"]
    pulled = engine.pull(f"{name}@{digest}")
    docker_cleanup.image(f"{name}@{digest}")
    assert pulled.id == built_id
    for key, value in world.labels.items():
        assert pulled.labels[key] == value
    assert f"{name}@{digest}" in pulled.digests

    record = json.loads(Path(result["record_path"]).read_text())
    assert Path(result["record_path"]).parent == world.verdict_path.parent
    assert record["subject"][0] == {"name": name, "digest": {"sha256": digest.removeprefix("sha256:")}}
    assert record["predicate"]["image"]["id"] == built_id

    # idempotent: a second run pushes nothing and keeps the digest
    assert main(_tag_args(world, image, registry, repo, "--json")) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["digest"] == digest and again["pushed"] is False
    # ... and the first run's record is kept, not replaced (issue 26 §4)
    kept = world.verdict_path.parent / "tag-attempts" / "1" / "record.json"
    assert json.loads(kept.read_text()) == record


def test_refusals_push_nothing(
    engine: Engine,
    base_image: str,
    releases: Releases,
    registry: Registry,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = releases.repo("refuse")
    world, image = releases.candidate(registry, repo)
    good = world.verdict()
    client = RegistryClient(registry.host)

    # a failed verdict
    world.write_verdict(status="failed", passed=False, reason="gsm8k accuracy 0.41 < 0.90")
    assert main(_tag_args(world, image, registry, repo)) == ExitCode.TAG
    err = capsys.readouterr().err
    assert "the smoke test failed" in err and "0.41" in err

    # a verdict that says passed while its gsm8k gate failed, and one with no checks (issue 26.1)
    checks = [
        {**c, "passed": False, "status": "failed", "message": "accuracy 0.41 < 0.908"}
        if c["name"] == "gsm8k"
        else c
        for c in good["checks"]
    ]
    world.write_verdict(**{**good, "checks": checks})
    assert main(_tag_args(world, image, registry, repo)) == ExitCode.TAG
    err = capsys.readouterr().err
    assert "disagrees with itself" in err and "check 'gsm8k' failed: accuracy 0.41" in err
    world.write_verdict(**{**good, "checks": []})
    assert main(_tag_args(world, image, registry, repo)) == ExitCode.TAG
    assert "the recipe's gate(s) 'server-ready', 'chat'" in capsys.readouterr().err

    # a verdict for another image (the base image)
    base = engine.image(base_image)
    assert base is not None
    world.write_verdict(**{**good, "image": {"ref": base_image, "id": base.id, "digest": ""}})
    assert main(_tag_args(world, image, registry, repo)) == ExitCode.TAG
    assert "foreign verdict" in capsys.readouterr().err

    # a verdict bound by image ID only (smoke-tested by a local name): tag pushes only a tested digest
    world.write_verdict(**{**good, "image": {**good["image"], "ref": image, "digest": ""}})
    assert main(_tag_args(world, image, registry, repo)) == ExitCode.TAG
    err = capsys.readouterr().err
    assert "not to a registry digest" in err and "pipeline smoke --image REPO@sha256:" in err

    # an invalid tag
    world.write_verdict(**good)
    monkeypatch.setenv("PIPELINE_TAG_TEMPLATE", "{model}:{date}")
    assert main(_tag_args(world, image, registry, repo)) == ExitCode.USAGE
    assert "not a valid registry tag" in capsys.readouterr().err
    monkeypatch.delenv("PIPELINE_TAG_TEMPLATE")

    assert _release_tags(client, repo) == []
    assert not (world.verdict_path.parent / "record.json").exists()


def _restart(registry: Registry) -> subprocess.Popen[bytes]:
    """Start docker-registry again on the same port and storage (the fixture's config)."""
    with (registry.root / "registry-restart.log").open("wb") as logf:
        proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(registry.root / "config.yml")],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 15
    while True:
        try:
            urllib.request.urlopen(f"{registry.url}/v2/", timeout=1).close()
            return proc
        except urllib.error.HTTPError:
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("docker-registry did not come back")
            time.sleep(0.1)


@pytest.fixture
def restarted() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def test_registry_stopped_before_moving_tags_leaves_them_untouched(
    engine: Engine,
    releases: Releases,
    registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
    restarted: list[subprocess.Popen[bytes]],
) -> None:
    repo = releases.repo("stop")
    verified = f"{MODEL}-verified"
    client = RegistryClient(registry.host)

    # first release: the moving tag points at image A
    world_a, image_a = releases.candidate(registry, repo, "a")

    def run(world: World, image: str) -> Any:
        return _tag_run(engine, world, image, registry, repo, push_latest=False)

    first = run(world_a, image_a)
    assert client.manifest_digest(repo, verified) == first.digest

    # second release (another image, a later day): stop the registry after the immutable push
    world_b, image_b = releases.candidate(registry, repo, "b", finished="2026-06-30T08:00:00+00:00")
    real_put = RegistryClient.put_manifest
    events: list[str] = []

    def stop_then_put(self: RegistryClient, *a: Any, **kw: Any) -> str:
        if not events and a[1] == verified:  # after the immutable tag's PUT, before the moving tag's
            events.append("stopped")
            registry.process.terminate()
            registry.process.wait(timeout=10)
        return real_put(self, *a, **kw)

    monkeypatch.setattr(RegistryClient, "put_manifest", stop_then_put)
    start = time.monotonic()
    with pytest.raises(InfraError) as e:
        run(world_b, image_b)
    print(
        f"FAULT | registry stopped before the moving PUTs (stays down) | exit 11, state unknown | "
        f"moving tags untouched | {time.monotonic() - start:.2f} s"
    )
    monkeypatch.setattr(RegistryClient, "put_manifest", real_put)
    assert events == ["stopped"]
    assert "moving the tags" in str(e.value)

    restarted.append(_restart(registry))
    immutable_b = _immutable(world_b).replace("20260629", "20260630")
    digest_b = client.manifest_digest(repo, immutable_b)
    assert digest_b is not None and digest_b != first.digest  # the immutable push did happen
    assert client.manifest_digest(repo, verified) == first.digest  # the moving tag did not move
    # the record of the second release is written (before any moving tag), pointing at B
    record = json.loads((world_b.verdict_path.parent / "record.json").read_text())
    assert record["subject"][0]["digest"]["sha256"] == digest_b.removeprefix("sha256:")
    # ... and it says what happened, not what was planned: no moving tag moved, state unknown
    assert record["predicate"]["image"]["moving_tags"] == []
    assert record["predicate"]["image"]["moving_state"] == "unknown"

    # once the registry is back, the same command finishes the job
    second = run(world_b, image_b)
    assert second.digest == digest_b and not second.pushed
    assert client.manifest_digest(repo, verified) == digest_b


def _assert_secret_nowhere(secret: str, texts: list[str], roots: list[Path]) -> None:
    for t in texts:
        assert secret not in t
    for root in roots:
        for f in root.rglob("*"):
            if f.is_file():
                assert secret not in f.read_text(errors="replace"), f"credential written to {f}"


def test_auth_registry_credentials_never_shown(
    releases: Releases,
    auth_registry: Registry,
    tmp_path: Path,
    cli_env: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert auth_registry.username is not None and auth_registry.password is not None
    user, password = auth_registry.username, auth_registry.password
    repo = releases.repo("auth")
    world, image = releases.candidate(auth_registry, repo)
    texts: list[str] = []

    # no credentials: refused, clearly
    assert main(["-vv", *_tag_args(world, image, auth_registry, repo)]) == ExitCode.TAG
    out, err = capsys.readouterr()
    texts += [out, err]
    assert "credentials" in err

    # wrong password: refused, neither password shown
    wrong = "wrong-" + password[::-1]
    monkeypatch.setenv("PIPELINE_REGISTRY_USER", user)
    monkeypatch.setenv("PIPELINE_REGISTRY_PASSWORD", wrong)
    assert main(["-vv", *_tag_args(world, image, auth_registry, repo)]) == ExitCode.TAG
    out, err = capsys.readouterr()
    texts += [out, err]
    assert wrong not in out + err

    # right credentials from the environment
    monkeypatch.setenv("PIPELINE_REGISTRY_PASSWORD", password)
    assert main(["-vv", *_tag_args(world, image, auth_registry, repo, "--json")]) == 0
    out, err = capsys.readouterr()
    texts += [out, err]
    digest = json.loads(out)["digest"]
    authed = RegistryClient(auth_registry.host, credentials=(user, password))
    assert authed.manifest_digest(repo, f"{MODEL}-verified") == digest

    # right credentials from a Docker config instead
    monkeypatch.delenv("PIPELINE_REGISTRY_USER")
    monkeypatch.delenv("PIPELINE_REGISTRY_PASSWORD")
    docker_config = tmp_path / "dockercfg"
    docker_config.mkdir()
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (docker_config / "config.json").write_text(json.dumps({"auths": {auth_registry.host: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(docker_config))
    assert main(["-vv", *_tag_args(world, image, auth_registry, repo, "--json")]) == 0
    out, err = capsys.readouterr()
    texts += [out, err]
    assert json.loads(out)["digest"] == digest

    _assert_secret_nowhere(password, texts, [cli_env, world.root])
    _assert_secret_nowhere(wrong, texts, [cli_env, world.root])


def test_cosign_attests_the_pushed_digest(
    engine: Engine,
    releases: Releases,
    registry: Registry,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stand-in `cosign` on PATH records how it is called (the real one needs keys and a Rekor)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "cosign-calls.json"
    script = bindir / "cosign"
    script.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        "args = sys.argv[1:]\n"
        "pred = json.load(open(args[args.index('--predicate') + 1]))\n"
        f"json.dump({{'args': args, 'predicate_image': pred['image']}}, open({str(calls)!r}, 'w'))\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    repo = releases.repo("cosign")
    world, image = releases.candidate(registry, repo)
    assert main(_tag_args(world, image, registry, repo, "--cosign", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    call = json.loads(calls.read_text())
    assert result["attested"] is True
    assert call["args"][:2] == ["attest", "--yes"]
    assert call["args"][-1] == f"{registry.repo(repo)}@{result['digest']}"
    assert call["predicate_image"]["digest"] == result["digest"]
    assert "--allow-http-registry" in call["args"]


# ---------------------------------------------------------------------------- moving tags (issue 13.3)


def _tag_run(
    engine: Engine,
    world: World,
    image: str,
    registry: Registry,
    repo: str,
    *,
    push_latest: bool = True,
    env: dict[str, str] | None = None,
    **kw: Any,
) -> Any:
    return tag_verified(
        engine,
        image=image,
        verdict_path=world.verdict_path,
        lock=world.lock_path,
        recipe_path=None,
        settings=world.settings(registry=registry.host, repository=repo, push_latest=push_latest),
        registry=None,
        log=Logger(stream=io.StringIO()),
        env=env or {},
        **kw,
    )


def test_an_older_release_never_moves_the_moving_tags_back(
    releases: Releases,
    registry: Registry,
    capsys: pytest.CaptureFixture[str],
) -> None:
    repo = releases.repo("order")
    client = RegistryClient(registry.host)
    newer, image_new = releases.candidate(registry, repo, "new", created="2026-06-30T10:00:00Z")
    older, image_old = releases.candidate(
        registry, repo, "old", created="2026-06-20T10:00:00Z", finished="2026-06-28T08:00:00+00:00"
    )

    assert main(_tag_args(newer, image_new, registry, repo, "--push-latest", "--json")) == 0
    digest_new = json.loads(capsys.readouterr().out)["digest"]
    # re-running the older verdict after the newer release: refused before anything is pushed
    start = time.monotonic()
    assert main(_tag_args(older, image_old, registry, repo, "--push-latest")) == ExitCode.TAG
    print(
        f"FAULT | tag an older verdict after a newer release | exit 10 | nothing pushed | "
        f"{time.monotonic() - start:.2f} s"
    )
    err = capsys.readouterr().err
    assert "backwards" in err and "2026-06-30T10:00:00Z" in err and "--allow-older" in err
    tags = client.tags(repo)
    assert not any("20260628" in t for t in tags)  # the older immutable tag was not pushed either
    for tag in (f"{MODEL}-verified", "latest"):
        assert client.manifest_digest(repo, tag) == digest_new
    assert not (older.verdict_path.parent / "record.json").exists()
    # going back on purpose, said loudly
    assert main(_tag_args(older, image_old, registry, repo, "--push-latest", "--allow-older", "--json")) == 0
    out, err = capsys.readouterr()
    back = json.loads(out)["digest"]
    assert "MOVING BACK" in err and back != digest_new
    for tag in (f"{MODEL}-verified", "latest"):
        assert client.manifest_digest(repo, tag) == back


def test_registry_killed_during_a_moving_put_ends_in_one_consistent_state(
    engine: Engine,
    releases: Releases,
    registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
    restarted: list[subprocess.Popen[bytes]],
) -> None:
    """The registry stores `verified`→B and dies before answering (the issue saw verified→B,
    latest→A and a tool that restored nothing). Now: state read back, the move finished."""
    import threading

    repo = releases.repo("split")
    client = RegistryClient(registry.host)
    world_a, image_a = releases.candidate(registry, repo, "a")
    first = _tag_run(engine, world_a, image_a, registry, repo)
    world_b, image_b = releases.next_day(registry, repo)
    real_put = RegistryClient.put_manifest
    events: list[str] = []

    def stored_then_killed(self: RegistryClient, repo_: str, tag: str, *a: Any, **kw: Any) -> str:
        got = real_put(self, repo_, tag, *a, **kw)
        if tag == f"{MODEL}-verified" and not events:
            events.append("killed")
            registry.process.kill()
            registry.process.wait(timeout=10)
            threading.Timer(2.0, lambda: restarted.append(_restart(registry))).start()
            raise InfraError("the registry did not answer while trying to put the manifest (killed)")
        return got

    monkeypatch.setattr(RegistryClient, "put_manifest", stored_then_killed)
    start = time.monotonic()
    result = _tag_run(engine, world_b, image_b, registry, repo)
    print(
        f"FAULT | registry killed during the PUT of a moving tag (back after 2 s) | exit 0, "
        f"{result.state} | no split | {time.monotonic() - start:.2f} s"
    )
    monkeypatch.setattr(RegistryClient, "put_manifest", real_put)
    assert events == ["killed"] and result.state == "finished"
    assert result.digest != first.digest and result.moved == [f"{MODEL}-verified", "latest"]
    for tag in (f"{MODEL}-verified", "latest"):
        assert client.manifest_digest(repo, tag) == result.digest  # never split
    record = json.loads((world_b.verdict_path.parent / "record.json").read_text())
    assert record["predicate"]["image"]["moving_state"] == "finished"
    assert record["predicate"]["image"]["moving_tags"] == [f"{MODEL}-verified", "latest"]


def test_a_manifest_answering_http_500_is_said_and_repaired_by_pushing_the_candidate_again(
    engine: Engine,
    releases: Releases,
    registry: Registry,
) -> None:
    """A push killed halfway left an empty revision link: the smoke-tested digest, the tags and
    `verified` answer 500. Tag says so (exit 11, nothing pushed) and names the repair: the
    candidate pushed again from the engine rewrites the link; then the same tag finishes."""
    repo = releases.repo("broken")
    world, image = releases.candidate(registry, repo)
    first = _tag_run(engine, world, image, registry, repo)
    link = (
        registry.root / "storage/docker/registry/v2/repositories" / repo / "_manifests/revisions/sha256"
        / first.digest.removeprefix("sha256:") / "link"
    )  # fmt: skip
    assert link.is_file()
    link.write_text("")  # what the killed push left
    status = _head_status(registry, repo, f"{MODEL}-verified")
    assert status == 500
    start = time.monotonic()
    with pytest.raises(InfraError) as e:
        _tag_run(engine, world, image, registry, repo)
    print(
        f"FAULT | manifest answering HTTP 500 (empty revision link) | exit {e.value.exit_code}, repair "
        f"named | nothing pushed | {time.monotonic() - start:.2f} s"
    )
    assert e.value.exit_code == ExitCode.INFRA
    text = str(e.value)
    assert "answers HTTP 500" in text and "Push the candidate to that repository again" in text
    # the repair it names: the candidate pushed again from the engine that holds it
    info = engine.image(image)
    assert info is not None
    candidate = next(t for t in info.tags if t.startswith(f"{registry.repo(repo)}:candidate-"))
    assert engine.push(*candidate.rsplit(":", 1)) == first.digest
    second = _tag_run(engine, world, image, registry, repo)
    assert second.digest == first.digest
    assert _head_status(registry, repo, f"{MODEL}-verified") == 200
    assert _head_status(registry, repo, first.immutable_ref.rsplit(":", 1)[1]) == 200


def _head_status(registry: Registry, repo: str, tag: str) -> int:
    req = urllib.request.Request(
        f"{registry.url}/v2/{repo}/manifests/{tag}",
        method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


# ---------------------------------------------------------------------------- moving tags (issue 26 §4)


def _moving_state(world: World) -> dict[str, Any]:
    image: dict[str, Any] = json.loads((world.verdict_path.parent / "record.json").read_text())["predicate"][
        "image"
    ]
    return image


def test_a_persistent_http_500_on_one_moving_put_rolls_back_with_exit_11(
    engine: Engine,
    releases: Releases,
    registry: Registry,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The rollback rebuilt RegistryUnavailable with type(err) and crashed: exit 1, record `pending`."""
    repo = releases.repo("put500")
    verified = f"{MODEL}-verified"
    client = RegistryClient(registry.host)
    world_a, image_a = releases.candidate(registry, repo, "a")
    first = _tag_run(engine, world_a, image_a, registry, repo, push_latest=False)
    # a file where distribution keeps the tag's directory: every PUT and HEAD of `latest` is HTTP 500
    tags_dir = registry.root / "storage/docker/registry/v2/repositories" / repo / "_manifests/tags"
    (tags_dir / "latest").write_text("")
    assert _head_status(registry, repo, "latest") == 500
    world_b, image_b = releases.next_day(registry, repo)
    start = time.monotonic()
    code = main(_tag_args(world_b, image_b, registry, repo, "--push-latest"))
    err = capsys.readouterr().err
    print(
        f"FAULT | persistent HTTP 500 on one moving PUT | exit {code}, rolled back | "
        f"{verified} restored | {time.monotonic() - start:.2f} s"
    )
    assert code == ExitCode.INFRA, err
    assert f"rolled back: {verified} restored" in err and "internal error" not in err
    assert client.manifest_digest(repo, verified) == first.digest
    assert _moving_state(world_b)["moving_state"] == "rolled back"
    assert _moving_state(world_b)["moving_tags"] == []


def test_a_refused_put_after_a_new_moving_tag_is_a_split_said_plainly_and_repaired_by_the_command_it_names(
    engine: Engine,
    releases: Releases,
    auth_registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first --push-latest; the real registry answers 401 to the PUT of `latest` (the credentials
    are wrong for that one request). `verified` did not exist before and distribution 2.8 cannot
    delete a tag alone: the record and the message said `rolled back`, "nothing was moved"."""
    assert auth_registry.username is not None and auth_registry.password is not None
    user, password = auth_registry.username, auth_registry.password
    env = {"PIPELINE_REGISTRY_USER": user, "PIPELINE_REGISTRY_PASSWORD": password}
    repo = releases.repo("split")
    verified = f"{MODEL}-verified"
    client = RegistryClient(auth_registry.host, credentials=(user, password))
    world, image = releases.candidate(auth_registry, repo)
    real_put = RegistryClient.put_manifest

    def wrong_password_for_latest(self: RegistryClient, repo_: str, tag: str, *a: Any, **kw: Any) -> str:
        if tag != "latest":
            return real_put(self, repo_, tag, *a, **kw)
        good, self._credentials = self._credentials, Credentials(user, "wrong-" + password)
        try:
            return real_put(self, repo_, tag, *a, **kw)
        finally:
            self._credentials = good

    monkeypatch.setattr(RegistryClient, "put_manifest", wrong_password_for_latest)
    start = time.monotonic()
    with pytest.raises(TagError) as e:
        _tag_run(engine, world, image, auth_registry, repo, env=env)
    print(
        f"FAULT | HTTP 401 on the second moving PUT, the first tag new (distribution 2.8: no tag delete) | "
        f"exit {e.value.exit_code}, split stated | {verified} on the new digest | "
        f"{time.monotonic() - start:.2f} s"
    )
    monkeypatch.setattr(RegistryClient, "put_manifest", real_put)
    assert e.value.exit_code == ExitCode.TAG
    immutable = _immutable(world)
    digest = client.manifest_digest(repo, immutable)
    assert digest is not None and client.manifest_digest(repo, verified) == digest
    assert client.manifest_digest(repo, "latest") is None
    text, hint = str(e.value), e.value.hint or ""
    assert f"SPLIT: {verified} still point(s) at {digest} while latest do not" in text
    assert "the registry would not delete" in text and "nothing was moved" not in text + hint
    assert "--push-latest" in hint  # latest is one of the tags it finishes
    rerun = hint[hint.index("`") + 1 : hint.rindex("`")]
    assert rerun.startswith(f"pipeline tag --image {image} --verdict {world.verdict_path}")
    state = _moving_state(world)
    assert state["moving_state"] == "split" and state["moving_tags"] == [verified]
    assert "SPLIT" in state["moving_note"]
    # the repair the message names: the same command, once the cause is gone, finishes the move
    monkeypatch.setenv("PIPELINE_REGISTRY_USER", user)
    monkeypatch.setenv("PIPELINE_REGISTRY_PASSWORD", password)
    assert main(shlex.split(rerun)[1:]) == 0
    assert client.manifest_digest(repo, "latest") == digest == client.manifest_digest(repo, verified)


def test_a_registry_stall_during_the_push_is_given_up_after_push_timeout_s(
    engine: Engine,
    releases: Releases,
    registry: Registry,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The registry stops answering (SIGSTOP) as the immutable push starts: `pipeline tag` used to
    wait as long as the stall lasted. Now it gives up after [tag] push_timeout_s, reads the state
    back, exits 11 and leaves the moving tag where it was; the same command finishes later."""
    repo = releases.repo("stall")
    verified = f"{MODEL}-verified"
    client = RegistryClient(registry.host)
    world_a, image_a = releases.candidate(registry, repo, "a")
    first = _tag_run(engine, world_a, image_a, registry, repo, push_latest=False)
    world_b, image_b = releases.next_day(registry, repo)
    real_push = RegistryClient.put_manifest
    stalled: list[int] = []

    def stall_then_push(self: RegistryClient, *a: Any, **kw: Any) -> str:
        if not stalled:
            stalled.append(registry.process.pid)
            os.kill(registry.process.pid, signal.SIGSTOP)
        return real_push(self, *a, **kw)

    monkeypatch.setattr(RegistryClient, "put_manifest", stall_then_push)
    monkeypatch.setenv("PIPELINE_PUSH_TIMEOUT_S", "4")
    start = time.monotonic()
    try:
        code = main(_tag_args(world_b, image_b, registry, repo))
    finally:
        if stalled:
            os.kill(stalled[0], signal.SIGCONT)
    err = capsys.readouterr().err
    print(
        f"FAULT | registry stalled (SIGSTOP) during the immutable push, push_timeout_s=4 | exit {code} | "
        f"moving tag untouched | {time.monotonic() - start:.2f} s"
    )
    assert stalled and code == ExitCode.INFRA, err
    assert "did not finish within 4 s" in err and "Read back:" in err
    assert "the moving tags were not touched" in err
    assert client.manifest_digest(repo, verified) == first.digest
    assert not (world_b.verdict_path.parent / "record.json").exists()
    # the registry answers again: the same command finishes the release
    monkeypatch.setattr(RegistryClient, "put_manifest", real_push)
    monkeypatch.delenv("PIPELINE_PUSH_TIMEOUT_S")
    capsys.readouterr()
    assert main(_tag_args(world_b, image_b, registry, repo, "--json")) == 0
    digest_b = json.loads(capsys.readouterr().out)["digest"]
    assert digest_b != first.digest and client.manifest_digest(repo, verified) == digest_b
