"""The tag flow with a fake engine and the in-memory registry: binding, naming, order, rollback."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
from filelock import FileLock

from pipeline import labels
from pipeline.errors import (
    ConfigError,
    ExitCode,
    InfraError,
    LockInconsistent,
    RunLocked,
    TagError,
    UsageError,
)
from pipeline.fsutil import sha256_file
from pipeline.lock import Lock
from pipeline.log import Logger
from pipeline.oci.engine import ImageInfo
from pipeline.oci.registry import MEDIA_DOCKER_MANIFEST, RegistryClient, parse_image_ref
from pipeline.release.record import PREDICATE_TYPE, STATEMENT_TYPE
from pipeline.release.tag import (
    TagResult,
    _tag_lock_path,
    _utc_date,
    patchset_id,
    plan_tags,
    render_tag,
    tag_fields,
    tag_verified,
)
from tests.fixtures.registry_fake import PASSWORD, USER, FakeRegistry, fake_session
from tests.fixtures.tag_world import (
    AITER_SHA,
    ATOM_SHA,
    GATES,
    MODEL,
    World,
    make_lock,
    make_world,
    passed_check,
)

REG = "127.0.0.1:5000"
REPO = "rocm/atom-dev"
IMAGE_ID = "sha256:" + hashlib.sha256(b"config").hexdigest()
EXPECTED_IMMUTABLE = f"{MODEL}-20260629-atom{ATOM_SHA[:7]}-aiter{AITER_SHA[:7]}-p{patchset_id(make_lock())}"


def _manifest(image_id: str) -> bytes:
    return json.dumps(
        {"schemaVersion": 2, "mediaType": MEDIA_DOCKER_MANIFEST, "config": {"digest": image_id}, "layers": []}
    ).encode()


class FakeEngine:
    """Holds one local image; `push` stores a manifest whose config is the image ID (tag never pushes)."""

    def __init__(self, registry: FakeRegistry, image_id: str, image_labels: dict[str, str]) -> None:
        self.registry = registry
        self.images = {"atom:test": ImageInfo(image_id, ["atom:test"], [], image_labels, "")}
        self.tagged: list[tuple[str, str, str]] = []
        self.removed: list[str] = []
        self.pushed: list[tuple[str, str, Mapping[str, str] | None]] = []
        self.push_digest_override: str | None = None

    def image(self, ref: str) -> ImageInfo | None:
        return self.images.get(ref) or next((i for i in self.images.values() if i.id == ref), None)

    def tag(self, image: str, repo: str, tag: str) -> None:
        self.tagged.append((image, repo, tag))

    def remove_image(self, ref: str, *, force: bool = False, missing_ok: bool = True) -> None:
        self.removed.append(ref)

    def push(self, repo: str, tag: str, auth_config: Mapping[str, str] | None = None) -> str:
        self.pushed.append((repo, tag, auth_config))
        image_id = self.tagged[-1][0]
        body = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_DOCKER_MANIFEST,
                "config": {"digest": image_id},
                "layers": [],
            }
        ).encode()
        digest = self.registry.add(parse_image_ref(repo).repository, tag, body)
        return self.push_digest_override or digest


@pytest.fixture
def fake() -> FakeRegistry:
    return FakeRegistry()


@pytest.fixture
def world(tmp_path: Path, fake: FakeRegistry) -> World:
    """The image's candidate pushed to the registry, and smoke-tested by that digest."""
    world = make_world(tmp_path / "w", image_id=IMAGE_ID)
    _push_candidate(world, fake)
    return world


def _push_candidate(world: World, fake: FakeRegistry) -> str:
    """What the build does: the candidate in the target repository; the verdict names that digest."""
    candidate = fake.add(REPO, "candidate", _manifest(IMAGE_ID))
    world.write_verdict(image={**world.verdict()["image"], "digest": candidate})
    return candidate


def _engine(world: World, fake: FakeRegistry) -> FakeEngine:
    return FakeEngine(fake, IMAGE_ID, world.labels)


def _puts(fake: FakeRegistry, tag: str = "") -> list[str]:
    """The manifest PUTs the registry saw (of `tag` only, when given)."""
    return [
        path
        for method, path, _ in fake.log
        if method == "PUT" and "/manifests/" in path and (not tag or path.endswith(f"/manifests/{tag}"))
    ]


def _run(
    world: World,
    engine: FakeEngine,
    fake: FakeRegistry,
    *,
    env: Mapping[str, str] | None = None,
    credentials: tuple[str, str] | None = None,
    log: Logger | None = None,
    allow_older: bool = False,
    build_attestations: Path | None = None,
    **settings: Any,
) -> TagResult:
    client = RegistryClient(REG, session=fake_session(fake), sleep=lambda s: None, credentials=credentials)
    return tag_verified(
        engine,
        **_request(
            world,
            fake,
            settings=world.settings(registry=REG, **settings),
            log=log or Logger(stream=io.StringIO()),
            env=env or {},
            client=client,
            lock_timeout=1,
            allow_older=allow_older,
            build_attestations=build_attestations,
        ),
    )


def _request(world: World, fake: FakeRegistry, **over: Any) -> dict[str, Any]:
    """tag_verified's keywords: the world's image, verdict and lock to the fake registry, quietly
    (`over` replaces or adds any)."""
    return {
        "image": "atom:test",
        "verdict_path": world.verdict_path,
        "lock": world.lock_path,
        "recipe_path": None,
        "settings": world.settings(registry=REG),
        "registry": None,
        "log": Logger(stream=io.StringIO()),
        "env": {},
        "client": RegistryClient(REG, session=fake_session(fake), sleep=lambda s: None),
        **over,
    }


# ------------------------------------------------------------------ happy path


def test_pushes_immutable_then_moves_and_records(world: World, fake: FakeRegistry) -> None:
    engine = _engine(world, fake)
    old = fake.add(REPO, f"{MODEL}-verified", b'{"old": true}')
    result = _run(world, engine, fake, push_latest=True)
    digest = fake.tags[REPO][EXPECTED_IMMUTABLE]
    assert result.immutable_ref == f"{REG}/{REPO}:{EXPECTED_IMMUTABLE}"
    assert result.digest == digest != old and result.pushed
    assert result.moved == [f"{MODEL}-verified", "latest"]
    assert fake.tags[REPO][f"{MODEL}-verified"] == digest and fake.tags[REPO]["latest"] == digest
    # the immutable tag is the smoke-tested digest, PUT by the registry API: the engine pushes nothing
    assert digest == world.verdict()["image"]["digest"] == fake.tags[REPO]["candidate"]
    assert engine.tagged == [] and engine.pushed == [] and len(_puts(fake, EXPECTED_IMMUTABLE)) == 1
    # order on the wire: the immutable tag is read back before any moving-tag PUT
    puts = [i for i, m in enumerate(fake.log) if m[0] == "PUT" and not m[1].endswith(EXPECTED_IMMUTABLE)]
    readback = [i for i, m in enumerate(fake.log) if m[0] == "HEAD" and m[1].endswith(EXPECTED_IMMUTABLE)]
    assert readback and puts and max(readback) < min(puts)
    # record: in-toto statement next to the verdict
    assert result.record_path == world.verdict_path.parent / "record.json"
    st = json.loads(result.record_path.read_text())
    assert st["_type"] == STATEMENT_TYPE and st["predicateType"] == PREDICATE_TYPE
    assert st["subject"] == [{"name": f"{REG}/{REPO}", "digest": {"sha256": digest.removeprefix("sha256:")}}]
    pred = st["predicate"]
    assert pred["lock"]["sha256"] == world.lock.digest()
    assert pred["lock"]["data"]["sources"]["atom"]["sha"] == ATOM_SHA
    assert pred["patches"] == [
        {"name": "0001-minimax-m3-split-kv-cache.patch", "sha256": "5" * 64, "status": "applied"}
    ]
    assert pred["recipe"]["sha256"] == world.verdict()["recipe"]["sha256"]
    assert [c["name"] for c in pred["smoke"]["checks"]] == list(GATES)
    assert pred["image"]["immutable_tag"] == EXPECTED_IMMUTABLE
    assert pred["tool"]["version"] and pred["times"]["verified"]
    # no build attestations given to this run: said, not left out
    assert pred["attestations"]["slsa_provenance"] is None and pred["attestations"]["sbom"] is None
    assert pred["attestations"]["note"].startswith("unknown:")
    # the record says what happened; predicate.json is what was true when it could be attested
    assert pred["image"]["moving_tags"] == [f"{MODEL}-verified", "latest"]
    assert pred["image"]["moving_state"] == "moved"
    attested = json.loads((world.verdict_path.parent / "predicate.json").read_text())
    assert attested["image"]["moving_tags"] == [] and attested["image"]["moving_state"] == "pending"
    assert {k: v for k, v in attested.items() if k not in ("image", "times")} == {
        k: v for k, v in pred.items() if k not in ("image", "times")
    }
    assert engine.removed == []  # no local push tag was made, none is left


def test_record_links_the_build_provenance_of_the_tagged_image(world: World, fake: FakeRegistry) -> None:
    from pipeline.image.provenance import build_provenance, write_build_attestations

    build_dir = world.verdict_path.parent.parent / "build"
    build_dir.mkdir()
    statement = build_provenance(
        image_id=IMAGE_ID,
        image_ref="atom:candidate-x",
        render_manifest={"inputs_digest": "d" * 64},
        builder="buildkit",
        selfcheck=None,
        cache_from="",
        steps=1,
        cached_steps=0,
    )
    att = write_build_attestations(
        build_dir, builder="buildkit", unsupported="none here", statement=statement
    )
    result = _run(world, _engine(world, fake), fake, build_attestations=att)
    rec = json.loads(result.record_path.read_text())["predicate"]["attestations"]
    assert rec["slsa_provenance"] is None and rec["sbom"] is None and rec["note"] == "none here"
    assert rec["build_provenance"]["path"] == str(build_dir / "provenance.json")


def test_second_run_is_idempotent(world: World, fake: FakeRegistry) -> None:
    engine = _engine(world, fake)
    first = _run(world, engine, fake)
    second = _run(world, engine, fake)
    assert second.digest == first.digest and not second.pushed
    assert len(_puts(fake, EXPECTED_IMMUTABLE)) == 1


def test_a_verdict_bound_by_image_id_only_is_refused_and_nothing_is_pushed(
    world: World, fake: FakeRegistry
) -> None:
    """An image never pushed (or smoke-tested by a local name): tag would push what the engine makes
    of it now, which nobody smoke-tested by digest."""
    world.write_verdict(image={**world.verdict()["image"], "digest": ""})
    with pytest.raises(TagError) as e:
        _run(world, _engine(world, fake), fake)
    text = str(e.value)
    assert e.value.exit_code == ExitCode.TAG
    assert "bound to image ID" in text and "not to a registry digest" in text
    assert "Push the candidate" in text and "pipeline smoke --image REPO@sha256:" in text
    assert _puts(fake) == [] and list(fake.tags[REPO]) == ["candidate"]
    assert not (world.verdict_path.parent / "record.json").exists()


def test_the_immutable_tag_is_the_smoke_tested_digest_not_a_name_that_moved(
    world: World, fake: FakeRegistry
) -> None:
    """The candidate tag is overwritten with another image after the smoke test; the engine's own
    push would give yet another manifest. Tag PUTs the verdict's digest and nothing else."""
    tested = world.verdict()["image"]["digest"]
    fake.add(REPO, "candidate", _manifest("sha256:" + "6" * 64))
    engine = _engine(world, fake)
    result = _run(world, engine, fake, push_latest=True)
    assert result.digest == tested == fake.tags[REPO][EXPECTED_IMMUTABLE]
    assert fake.tags[REPO][f"{MODEL}-verified"] == fake.tags[REPO]["latest"] == tested
    assert fake.tags[REPO]["candidate"] != tested and engine.pushed == [] and engine.tagged == []


def test_immutable_tag_holding_another_image_is_refused(world: World, fake: FakeRegistry) -> None:
    other = json.dumps(
        {"mediaType": MEDIA_DOCKER_MANIFEST, "config": {"digest": "sha256:" + "9" * 64}}
    ).encode()
    fake.add(REPO, EXPECTED_IMMUTABLE, other)
    before = fake.add(REPO, f"{MODEL}-verified", b'{"old": 1}')
    engine = _engine(world, fake)
    with pytest.raises(TagError, match="already exists and holds another image"):
        _run(world, engine, fake)
    assert _puts(fake) == [] and fake.tags[REPO][f"{MODEL}-verified"] == before


def test_readback_mismatch_leaves_moving_tags(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = fake.add(REPO, f"{MODEL}-verified", b'{"old": 1}')
    engine = _engine(world, fake)
    real = RegistryClient.manifest_digest
    pushed: list[str] = []

    def another_writer(self: RegistryClient, repository: str, reference: str) -> str | None:
        if reference == EXPECTED_IMMUTABLE and _puts(fake, EXPECTED_IMMUTABLE):
            pushed.append(reference)
            return "sha256:" + "e" * 64  # read back after our PUT: someone else's manifest
        return real(self, repository, reference)

    monkeypatch.setattr(RegistryClient, "manifest_digest", another_writer)
    with pytest.raises(TagError, match="now serves sha256:eeee"):
        _run(world, engine, fake)
    assert pushed
    assert fake.tags[REPO][f"{MODEL}-verified"] == before
    assert not (world.verdict_path.parent / "record.json").exists()


def test_registry_down_before_moving_leaves_moving_tags(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = fake.add(REPO, f"{MODEL}-verified", b'{"old": 1}')
    real_put = RegistryClient.put_manifest

    def down(self: RegistryClient, repo: str, tag: str, *a: Any, **kw: Any) -> str:
        if tag != EXPECTED_IMMUTABLE:  # after the immutable tag, before the moving tags
            fake.fail = [requests.ConnectionError("Connection refused")] * 50
        return real_put(self, repo, tag, *a, **kw)

    monkeypatch.setattr(RegistryClient, "put_manifest", down)
    with pytest.raises(InfraError) as e:
        _run(world, _engine(world, fake), fake)
    fake.fail = []
    assert fake.tags[REPO][f"{MODEL}-verified"] == before
    assert "moving the tags" in str(e.value) and e.value.exit_code == ExitCode.INFRA


def test_failure_on_second_moving_tag_restores_the_first(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = fake.add(REPO, f"{MODEL}-verified", b'{"old": 1}')
    old_latest = fake.add(REPO, "latest", b'{"old": 2}')
    real_put = RegistryClient.put_manifest

    def flaky(self: RegistryClient, repo: str, tag: str, body: bytes, media: str) -> str:
        if tag == "latest":
            fake.fail = [400]
        return real_put(self, repo, tag, body, media)

    monkeypatch.setattr(RegistryClient, "put_manifest", flaky)
    with pytest.raises(TagError) as e:
        _run(world, _engine(world, fake), fake, push_latest=True)
    assert fake.tags[REPO][f"{MODEL}-verified"] == old  # restored
    assert fake.tags[REPO]["latest"] == old_latest
    assert f"rolled back: {MODEL}-verified" in str(e.value)


def test_a_persistent_http_500_on_one_moving_put_rolls_back_with_exit_11(
    world: World, fake: FakeRegistry
) -> None:
    """Issue 26 §4: `_rollback` rebuilt RegistryUnavailable with type(err) and crashed (exit 1)."""
    old = fake.add(REPO, f"{MODEL}-verified", b'{"old": 1}')
    fake.refuse[("PUT", "latest")] = 500
    with pytest.raises(InfraError) as e:
        _run(world, _engine(world, fake), fake, push_latest=True)
    assert e.value.exit_code == ExitCode.INFRA and type(e.value) is InfraError
    assert fake.tags[REPO][f"{MODEL}-verified"] == old and "latest" not in fake.tags[REPO]
    assert f"rolled back: {MODEL}-verified restored" in str(e.value)
    record = json.loads((world.verdict_path.parent / "record.json").read_text())["predicate"]["image"]
    assert record["moving_state"] == "rolled back" and record["moving_tags"] == []


def test_a_new_moving_tag_is_deleted_on_rollback(world: World, fake: FakeRegistry) -> None:
    """Issue 26 §4: a first --push-latest, 401 on `latest`: `verified` did not exist before and stayed
    on the new digest while the record said rolled back. A registry that deletes tags: deleted."""
    fake.refuse[("PUT", "latest")] = 401
    with pytest.raises(TagError) as e:
        _run(world, _engine(world, fake), fake, push_latest=True)
    assert set(fake.tags[REPO]) == {"candidate", EXPECTED_IMMUTABLE}  # verified deleted, latest never made
    assert ("DELETE", f"/v2/{REPO}/manifests/{MODEL}-verified") in [m[:2] for m in fake.log]
    assert f"{MODEL}-verified deleted (it did not exist before)" in str(e.value)
    assert "nothing was moved" not in f"{e.value} {e.value.hint}"
    record = json.loads((world.verdict_path.parent / "record.json").read_text())["predicate"]["image"]
    assert record["moving_state"] == "rolled back" and record["moving_tags"] == []


def test_a_registry_that_cannot_delete_a_tag_leaves_a_split_said_plainly(
    world: World, fake: FakeRegistry
) -> None:
    fake.tag_deletes = False  # distribution 2.x
    fake.refuse[("PUT", "latest")] = 401
    with pytest.raises(TagError) as e:
        _run(world, _engine(world, fake), fake, push_latest=True)
    digest = fake.tags[REPO][EXPECTED_IMMUTABLE]
    assert fake.tags[REPO][f"{MODEL}-verified"] == digest and "latest" not in fake.tags[REPO]
    text = str(e.value)
    assert f"SPLIT: {MODEL}-verified still point(s) at {digest} while latest do not" in text
    assert "the registry would not delete" in text and "DIGEST_INVALID" in text
    assert "nothing was moved" not in f"{text} {e.value.hint}"
    hint = e.value.hint or ""
    assert f"pipeline tag --image atom:test --verdict {world.verdict_path}" in hint
    assert "--push-latest" in hint and f"--repository {REPO}" in hint
    record = json.loads((world.verdict_path.parent / "record.json").read_text())["predicate"]["image"]
    assert record["moving_state"] == "split" and record["moving_tags"] == [f"{MODEL}-verified"]
    assert "SPLIT" in record["moving_note"]
    # the repair the message names: once the cause is gone, the same command finishes the move
    fake.refuse.clear()
    again = _run(world, _engine(world, fake), fake, push_latest=True)
    assert again.moved == [f"{MODEL}-verified", "latest"] and fake.tags[REPO]["latest"] == digest


def test_every_attempt_keeps_its_record(world: World, fake: FakeRegistry) -> None:
    """Issue 26 §4: a failed attempt rewrote record.json and the release's record was gone."""
    released = _run(world, _engine(world, fake), fake)
    first = json.loads(released.record_path.read_text())
    first_predicate = (world.verdict_path.parent / "predicate.json").read_text()
    fake.refuse[("PUT", "latest")] = 500  # the next attempt fails while moving `latest`
    with pytest.raises(InfraError):
        _run(world, _engine(world, fake), fake, push_latest=True)
    run_dir = world.verdict_path.parent
    assert json.loads((run_dir / "record.json").read_text())["predicate"]["image"]["moving_state"] == (
        "rolled back"
    )
    kept = run_dir / "tag-attempts" / "1"
    assert json.loads((kept / "record.json").read_text()) == first
    assert first["predicate"]["image"]["moving_state"] == "moved"
    assert (kept / "predicate.json").read_text() == first_predicate
    fake.refuse.clear()
    _run(world, _engine(world, fake), fake, push_latest=True)
    assert sorted(p.name for p in (run_dir / "tag-attempts").iterdir()) == ["1", "2"]
    second = json.loads((run_dir / "tag-attempts" / "2" / "record.json").read_text())
    assert second["predicate"]["image"]["moving_state"] == "rolled back"


def test_a_push_that_stalls_is_given_up_after_push_timeout_s_and_the_state_read_back(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 §4: a registry stall held `pipeline tag` as long as it lasted."""
    import threading

    old = fake.add(REPO, f"{MODEL}-verified", b'{"old": 1}')
    engine = _engine(world, fake)
    release = threading.Event()
    real_put = RegistryClient.put_manifest

    def stalled(self: RegistryClient, repository: str, tag: str, *a: Any) -> str:
        release.wait(60)  # the registry stopped answering
        return real_put(self, repository, tag, *a)

    monkeypatch.setattr(RegistryClient, "put_manifest", stalled)
    try:
        with pytest.raises(InfraError) as e:
            _run(world, engine, fake, push_timeout_s=1)
    finally:
        release.set()
    text = str(e.value)
    assert e.value.exit_code == ExitCode.INFRA and "did not finish within 1 s" in text
    assert "push_timeout_s" in text and "the moving tags were not touched" in text
    assert f"Read back: {EXPECTED_IMMUTABLE} → absent, {MODEL}-verified → {old}" in text
    assert fake.tags[REPO][f"{MODEL}-verified"] == old
    assert not (world.verdict_path.parent / "record.json").exists()


# ------------------------------------------------------------------ refusals (nothing pushed)


def _refused(world: World, fake: FakeRegistry, exc: type[Exception] = TagError, **settings: Any) -> str:
    engine = _engine(world, fake)
    with pytest.raises(exc) as e:
        _run(world, engine, fake, **settings)
    assert _puts(fake) == [] and list(fake.tags[REPO]) == ["candidate"]
    assert not (world.verdict_path.parent / "record.json").exists()
    return str(e.value)


@pytest.mark.parametrize(
    ("status", "words"),
    [("failed", "the smoke test failed"), ("no-hardware", "did not run"), ("error", "could not complete")],
)
def test_failed_verdict_refused(world: World, fake: FakeRegistry, status: str, words: str) -> None:
    world.write_verdict(status=status, passed=False, reason="gsm8k accuracy 0.41 < 0.90")
    msg = _refused(world, fake)
    assert "did not pass" in msg and words in msg and "0.41" in msg


def test_passed_flag_false_refused_even_if_status_says_passed(world: World, fake: FakeRegistry) -> None:
    world.write_verdict(passed=False)
    assert "is inconsistent: status 'passed' but passed=False" in _refused(world, fake)


# ------------------------------------------------------------------ the result is derived (issue 26.1)


def _with_check(world: World, name: str, **fields: Any) -> list[dict[str, Any]]:
    return [{**c, **fields} if c["name"] == name else c for c in world.verdict()["checks"]]


def test_a_verdict_whose_gate_failed_but_says_passed_is_refused(world: World, fake: FakeRegistry) -> None:
    """The issue's repro: gsm8k failed, the top level left at passed: true. It used to tag."""
    world.write_verdict(
        checks=_with_check(world, "gsm8k", passed=False, status="failed", message="accuracy 0.41 < 0.908")
    )
    msg = _refused(world, fake)
    assert "disagrees with itself" in msg and "it says passed" in msg
    assert "check 'gsm8k' failed: accuracy 0.41 < 0.908" in msg


def test_a_verdict_with_no_checks_is_refused(world: World, fake: FakeRegistry) -> None:
    world.write_verdict(checks=[])
    msg = _refused(world, fake)
    assert "disagrees with itself" in msg
    assert "the recipe's gate(s) 'server-ready', 'chat', 'gsm8k', 'serving-benchmark[c16]'" in msg


def test_a_passed_gate_whose_figures_fail_the_recipe_is_refused(world: World, fake: FakeRegistry) -> None:
    """The gsm8k check edited to passed, its value left at 0.41: the figures decide, not the flag."""
    world.write_verdict(checks=_with_check(world, "gsm8k", figures={"value": 0.41, "samples": 1319}))
    msg = _refused(world, fake)
    assert "check 'gsm8k' says passed but its exact_match,flexible-extract 0.41 over 1319 documents" in msg
    assert "below the recipe's bound 0.9078" in msg


def test_a_check_whose_passed_and_status_disagree_is_refused(world: World, fake: FakeRegistry) -> None:
    world.write_verdict(checks=_with_check(world, "chat", status="failed"))
    assert "check 'chat' says passed=true but status 'failed'" in _refused(world, fake)


def test_a_missing_benchmark_row_is_refused(world: World, fake: FakeRegistry) -> None:
    world.write_verdict(
        checks=[c for c in world.verdict()["checks"] if c["name"] != "serving-benchmark[c64]"]
    )
    assert "the recipe's gate(s) 'serving-benchmark[c64]' are missing" in _refused(world, fake)


def test_a_check_the_recipe_has_not_or_a_check_twice_is_refused(world: World, fake: FakeRegistry) -> None:
    world.write_verdict(checks=[*world.verdict()["checks"], passed_check("gsm8k-easy")])
    assert "check(s) 'gsm8k-easy' are not gates of its recipe" in _refused(world, fake)
    world.write_verdict(checks=[*world.verdict()["checks"][:-1], passed_check("chat")])
    assert "check 'chat' appears 2 times" in _refused(world, fake)


def test_a_quick_verdict_needs_the_quick_gates(world: World, fake: FakeRegistry) -> None:
    """`--quick` runs the quick benchmark rows: the gates are planned with the recorded options."""
    quick = {**world.verdict()["options"], "quick": True}
    world.write_verdict(options=quick)  # still holds c64: a row a quick run never has
    assert "'serving-benchmark[c64]' are not gates of its recipe" in _refused(world, fake)
    world.write_verdict(options={**quick, "quick": "yes"})
    assert "options.quick is 'yes'" in _refused(world, fake)
    world.write_verdict(
        options=quick, checks=[passed_check(n) for n in GATES if n != "serving-benchmark[c64]"]
    )
    result = _run(world, _engine(world, fake), fake)
    assert result.moved == [f"{MODEL}-verified"]


def test_cli_self_contradicting_verdict_refused_before_the_engine(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    monkeypatch.chdir(world.root)
    world.write_verdict(checks=[])
    assert main(_argv(world)) == ExitCode.TAG  # the engine (not set up here) was never reached
    assert "disagrees with itself" in capsys.readouterr().err


def test_verdict_without_server_evidence_refused(world: World, fake: FakeRegistry) -> None:
    """A pass that does not prove who answered (an older pipeline, a leaked server) tags nothing."""
    data = world.verdict()
    del data["server"]
    world.verdict_path.write_text(json.dumps(data))
    assert "does not prove which server answered" in _refused(world, fake)


def test_verdict_whose_server_ran_another_image_refused(world: World, fake: FakeRegistry) -> None:
    other = "sha256:" + "9" * 64
    world.write_verdict(server={**world.verdict()["server"], "image_id": other})
    text = _refused(world, fake)
    assert "the server that answered the smoke test ran image 999999999999" in text
    assert "does not bind to this image" in text


def test_missing_verdict_refused(world: World, fake: FakeRegistry) -> None:
    world.verdict_path.unlink()
    assert "missing verdict" in _refused(world, fake)


def test_corrupt_verdict_refused(world: World, fake: FakeRegistry) -> None:
    world.verdict_path.write_text("{not json")
    assert "is not valid JSON" in _refused(world, fake)
    world.verdict_path.write_text(json.dumps({"schema": "something/else"}))
    assert "something/else" in _refused(world, fake)


def test_foreign_verdict_refused(world: World, fake: FakeRegistry) -> None:
    world.write_verdict(image={"ref": "atom:other", "id": "sha256:" + "7" * 64, "digest": ""})
    msg = _refused(world, fake)
    assert "foreign verdict" in msg and "777777777777" in msg and "atom:other" in msg


def test_missing_image_refused(world: World, fake: FakeRegistry) -> None:
    engine = _engine(world, fake)
    engine.images = {}
    with pytest.raises(TagError, match="does not exist in the Docker engine"):
        _run(world, engine, fake)


@pytest.mark.parametrize(
    ("label", "what"),
    [(labels.PAIR_DIGEST, "pair"), (labels.INPUTS_DIGEST, "inputs digest")],
)
def test_image_labels_must_match_verdict(world: World, fake: FakeRegistry, label: str, what: str) -> None:
    engine = _engine(world, fake)
    info = engine.images["atom:test"]
    engine.images["atom:test"] = ImageInfo(info.id, info.tags, [], {**info.labels, label: "f" * 64}, "")
    with pytest.raises(TagError) as e:
        _run(world, engine, fake)
    assert f"image's {what}" in str(e.value) and _puts(fake) == []


def test_a_verdict_that_binds_no_lock_is_refused(world: World, fake: FakeRegistry) -> None:
    world.write_verdict(lock_sha256="")  # smoke ran without the model's lock
    engine = _engine(world, fake)
    with pytest.raises(TagError) as e:
        _run(world, engine, fake)
    assert "binds no lock" in str(e.value) and "--lock" in (e.value.hint or "") and engine.pushed == []


def test_a_lock_of_another_pair_is_refused_though_the_verdict_names_it(
    world: World, fake: FakeRegistry
) -> None:
    """The verdict and the lock agree, but the lock does not pin the pair the image was built from."""
    engine = _engine(world, fake)  # labelled with the world's pair
    other = make_lock(patches=False)
    other.save(world.lock_path)
    world.write_verdict(lock_sha256=other.digest())
    with pytest.raises(LockInconsistent) as e:
        _run(world, engine, fake)
    assert "is not the lock the image" in str(e.value) and other.pair_digest()[:12] in str(e.value)
    assert e.value.exit_code == ExitCode.LOCK_INCONSISTENT
    assert engine.pushed == []


def test_two_models_of_one_pair_tag_the_same_image(world: World, fake: FakeRegistry) -> None:
    """One image, two models: each verdict binds its model's lock (same pair) and gets its own tags."""
    engine = _engine(world, fake)
    first = _run(world, engine, fake)
    other = "Kimi-K2.5-MXFP4"
    lock = make_lock(model=other)
    assert lock.pair_digest() == world.lock.pair_digest() and lock.digest() != world.lock.digest()
    lock_path = world.lock_path.with_name(f"{other}.toml")
    lock.save(lock_path)
    recipe = world.recipe_path.with_name(f"{other}.yaml")
    recipe.write_text(world.recipe_path.read_text().replace(f"name: {MODEL}", f"name: {other}"))
    verdict = world.verdict()
    verdict.update(
        lock_sha256=lock.digest(), recipe={"name": other, "path": str(recipe), "sha256": sha256_file(recipe)}
    )
    world.verdict_path.write_text(json.dumps(verdict))
    # lock=None: the verdict's model names locks/<model>.toml
    second = tag_verified(engine, **_request(world, fake, lock=None, lock_timeout=1))
    assert second.digest == first.digest
    assert fake.tags[REPO][f"{other}-verified"] == fake.tags[REPO][f"{MODEL}-verified"] == first.digest


def test_an_image_of_the_older_model_naming_pipeline_is_refused_with_what_to_do(
    world: World, fake: FakeRegistry
) -> None:
    engine = _engine(world, fake)
    old = {k: v for k, v in world.labels.items() if k != labels.PAIR_DIGEST}
    engine.images["atom:test"] = ImageInfo(
        IMAGE_ID, ["atom:test"], [], {**old, labels.OLD_LOCK_SHA256: world.lock.digest()}, ""
    )
    with pytest.raises(TagError) as e:
        _run(world, engine, fake)
    assert "older version of this pipeline" in str(e.value) and "Rebuild it" in (e.value.hint or "")
    assert engine.pushed == []


def test_unlabelled_image_refused(world: World, fake: FakeRegistry) -> None:
    engine = _engine(world, fake)
    engine.images["atom:test"] = ImageInfo(IMAGE_ID, ["atom:test"], [], {}, "")
    with pytest.raises(TagError, match="not built by this pipeline"):
        _run(world, engine, fake)


def test_stale_recipe_refused(world: World, fake: FakeRegistry) -> None:
    engine = _engine(world, fake)  # labels computed from the recipe as smoke-tested
    world.recipe_path.write_text(world.recipe_path.read_text() + "tp: 4\n")
    with pytest.raises(TagError) as e:
        _run(world, engine, fake)
    assert "recipe" in str(e.value) and "stale verdict" in str(e.value) and _puts(fake) == []


def test_stale_lock_refused(world: World, fake: FakeRegistry) -> None:
    """The lock changed where the image does not see it (a commit's subject): the pair is the
    image's, the verdict's lock is not this one."""
    engine = _engine(world, fake)
    lock = Lock.load(world.lock_path)
    atom = lock.sources.atom.model_copy(update={"subject": "edited by hand"})
    moved = lock.model_copy(update={"sources": lock.sources.model_copy(update={"atom": atom})})
    assert moved.pair_digest() == lock.pair_digest() and moved.digest() != lock.digest()
    moved.save(world.lock_path)
    with pytest.raises(TagError) as e:
        _run(world, engine, fake)
    assert "lock file" in str(e.value) and "stale verdict" in str(e.value) and _puts(fake) == []


def test_invalid_tag_template_refused(world: World, fake: FakeRegistry) -> None:
    msg = _refused(world, fake, UsageError, tag_template="{model}/bad:{date}")
    assert "is not a valid registry tag" in msg and f"{MODEL}/bad:20260629" in msg


def test_unknown_template_field_refused(world: World, fake: FakeRegistry) -> None:
    msg = _refused(world, fake, ConfigError, tag_template="{model}-{nope}")
    assert "{nope}" in msg and "{atom7}" in msg


def test_invalid_moving_tag_refused(world: World, fake: FakeRegistry) -> None:
    msg = _refused(world, fake, UsageError, moving_tags=["{model} verified"])
    assert "moving_tags" in msg


def test_cosign_asked_but_missing_refused_before_anything(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pipeline.release.tag.shutil.which", lambda name: None)
    assert "cosign" in _refused(world, fake, cosign=True)


def test_cosign_attests_before_moving(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pipeline.release.tag.shutil.which", lambda name: "/usr/bin/cosign")
    calls: list[tuple[list[str], int]] = []

    def fake_cosign(cmd: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
        calls.append((list(cmd), len(_puts(fake)) - len(_puts(fake, EXPECTED_IMMUTABLE))))
        return subprocess.CompletedProcess(list(cmd), 0, "", "")

    result = tag_verified(
        _engine(world, fake),
        **_request(
            world,
            fake,
            recipe_path=world.recipe_path,
            settings=world.settings(registry=REG, cosign=True),
            env={"COSIGN_KEY": "-----BEGIN KEY-----"},
            run_cosign=fake_cosign,
        ),
    )
    (cmd, puts_before), *_ = calls
    assert result.attested and puts_before == 0
    assert cmd[:3] == ["cosign", "attest", "--yes"] and cmd[-1] == f"{REG}/{REPO}@{result.digest}"
    assert PREDICATE_TYPE in cmd and "--key" in cmd and "-----BEGIN KEY-----" not in " ".join(cmd)
    assert cmd[cmd.index("--predicate") + 1].endswith("predicate.json")


def test_cosign_failure_leaves_moving_tags(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pipeline.release.tag.shutil.which", lambda name: "/usr/bin/cosign")
    with pytest.raises(TagError, match="cosign attest"):
        tag_verified(
            _engine(world, fake),
            **_request(
                world,
                fake,
                settings=world.settings(registry=REG, cosign=True),
                run_cosign=lambda cmd, env: subprocess.CompletedProcess(list(cmd), 1, "", "no key"),
            ),
        )
    assert f"{MODEL}-verified" not in fake.tags[REPO]


def test_tag_lock_held_by_another_run(world: World, fake: FakeRegistry) -> None:
    settings = world.settings(registry=REG)
    path = _tag_lock_path(settings.cache_dir, parse_image_ref(f"{REG}/{REPO}"))
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = FileLock(str(path))
    holder.acquire()
    try:
        engine = _engine(world, fake)
        with pytest.raises(RunLocked) as e:
            _run(world, engine, fake)
        assert e.value.exit_code == ExitCode.LOCKED and _puts(fake) == []
    finally:
        holder.release()


# ------------------------------------------------------------------ credentials


def test_credentials_reach_push_but_no_output_or_file(world: World, tmp_path: Path) -> None:
    fake = FakeRegistry(auth="basic")
    _push_candidate(world, fake)
    engine = _engine(world, fake)
    out = io.StringIO()
    log = Logger(stream=out, verbosity=2)
    log.attach(tmp_path / "runlog")
    env = {"PIPELINE_REGISTRY_USER": USER, "PIPELINE_REGISTRY_PASSWORD": PASSWORD}
    result = _run(world, engine, fake, env=env, credentials=(USER, PASSWORD), log=log)
    log.close()
    authz = [a for m, path, a in fake.log if m == "PUT" and path.endswith(EXPECTED_IMMUTABLE)]
    assert authz and all(a.startswith("Basic ") for a in authz)  # the immutable tag's PUT, authorised
    assert PASSWORD not in out.getvalue()
    for f in [*world.root.rglob("*"), *(tmp_path / "runlog").rglob("*")]:
        if f.is_file():
            assert PASSWORD not in f.read_text(errors="replace"), f
    assert PASSWORD not in repr(result)


def test_record_strips_userinfo_from_urls(world: World, fake: FakeRegistry) -> None:
    lock = make_lock(atom_url="https://x-access-token:ghp_SECRET123@github.com/ROCm/ATOM.git")
    lock.save(world.lock_path)
    world.write_verdict(lock_sha256=lock.digest(), pair_digest=lock.pair_digest())
    engine = _engine(world, fake)
    info = engine.images["atom:test"]
    engine.images["atom:test"] = ImageInfo(
        info.id, info.tags, [], {**info.labels, labels.PAIR_DIGEST: lock.pair_digest()}, ""
    )
    result = _run(world, engine, fake)
    text = result.record_path.read_text()
    assert "ghp_SECRET123" not in text and "https://github.com/ROCm/ATOM.git" in text


# ------------------------------------------------------------------ naming


def test_tag_fields_and_patchset() -> None:
    assert patchset_id(make_lock(patches=False)) == "0"
    ps = patchset_id(make_lock())
    assert ps.startswith("1.") and len(ps) == 9
    assert _utc_date("2026-06-30T01:30:00+02:00") == "20260629"
    assert _utc_date("2026-06-30T01:30:00Z") == "20260630"
    with pytest.raises(TagError):
        _utc_date("yesterday")


def test_plan_tags_from_settings(world: World) -> None:
    verdict_fields = tag_fields(make_lock(), _load(world), "sha256:" + "a" * 64)
    immutable, moving = plan_tags(world.settings(push_latest=True), verdict_fields)
    assert immutable == EXPECTED_IMMUTABLE and moving == [f"{MODEL}-verified", "latest"]
    assert render_tag("{model}-{inputs7}", verdict_fields, setting="tag_template") == f"{MODEL}-aaaaaaa"
    with pytest.raises(ConfigError, match="also a moving tag"):
        plan_tags(world.settings(tag_template="{model}-verified"), verdict_fields)


def _load(world: World) -> Any:
    from pipeline.release.tag import read_tag_verdict

    return read_tag_verdict(world.verdict_path).verdict


# ------------------------------------------------------------------ CLI


@pytest.fixture
def cli(world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """`pipeline tag` wired to the fake engine and the in-memory registry."""
    engine = _engine(world, fake)
    engine.close = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setattr("pipeline.oci.engine.Engine.connect", classmethod(lambda cls, *a, **kw: engine))
    real_init = RegistryClient.__init__

    def init(self: RegistryClient, registry: str, **kw: Any) -> None:
        kw.update(session=fake_session(fake), sleep=lambda s: None)
        real_init(self, registry, **kw)

    monkeypatch.setattr(RegistryClient, "__init__", init)
    monkeypatch.chdir(world.root)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(world.root / "cache"))
    return engine


def _argv(world: World, *extra: str) -> list[str]:
    return ["tag", "--image", "atom:test", "--verdict", str(world.verdict_path), "--registry", REG, *extra]


def test_cli_json_result(
    world: World, fake: FakeRegistry, cli: FakeEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    assert main(_argv(world, "--lock", str(world.lock_path), "--json", "--push-latest")) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["immutable_ref"] == f"{REG}/{REPO}:{EXPECTED_IMMUTABLE}"
    assert out["moved"] == [f"{MODEL}-verified", "latest"] and out["digest"] == fake.tags[REPO]["latest"]
    assert out["pinned_ref"] == f"{REG}/{REPO}@{out['digest']}"


def test_cli_default_lock_path_from_the_verdicts_model(
    world: World, fake: FakeRegistry, cli: FakeEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    (world.root / "pipeline.toml").write_text(f'[paths]\nlocks_dir = "{world.root / "locks"}"\n')
    assert main(_argv(world, "--repository", "team/atom")) == 0
    out = capsys.readouterr().out
    assert f"{REG}/team/atom@sha256:" in out and f"{MODEL}-verified" in out
    assert fake.tags["team/atom"][EXPECTED_IMMUTABLE]


def test_cli_failed_verdict_refused_before_the_engine(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    monkeypatch.chdir(world.root)
    world.write_verdict(status="no-hardware", passed=False, reason="no /dev/kfd")
    assert main(_argv(world)) == ExitCode.TAG  # the engine (forbidden here) was never reached
    err = capsys.readouterr().err
    assert "did not run" in err and "no /dev/kfd" in err
    world.verdict_path.unlink()
    assert main(_argv(world)) == ExitCode.TAG
    assert "missing verdict" in capsys.readouterr().err


def test_push_retried_on_infra_errors_then_gives_up(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(world, fake)
    real_put = RegistryClient.put_manifest
    failures = [InfraError("the registry could not be reached")] * 2

    def flaky(self: RegistryClient, repository: str, tag: str, *a: Any) -> str:
        if failures and tag == EXPECTED_IMMUTABLE:
            raise failures.pop()
        return real_put(self, repository, tag, *a)

    monkeypatch.setattr(RegistryClient, "put_manifest", flaky)
    sleeps: list[float] = []
    kwargs = _request(world, fake, sleep=sleeps.append)
    result = tag_verified(engine, **kwargs)
    assert result.pushed and sleeps == [1.0, 2.0]

    before = fake.tags[REPO][f"{MODEL}-verified"]
    fake.tags[REPO].pop(EXPECTED_IMMUTABLE)
    failures.extend([InfraError("down")] * 5)
    with pytest.raises(InfraError, match="gave up after 3 attempts"):
        tag_verified(engine, **kwargs)
    assert fake.tags[REPO][f"{MODEL}-verified"] == before


def test_verdict_may_be_given_as_its_run_directory(world: World, fake: FakeRegistry) -> None:
    run_dir = world.verdict_path.parent
    result = tag_verified(_engine(world, fake), **_request(world, fake, verdict_path=run_dir))
    assert result.record_path == world.verdict_path.parent / "record.json"


def test_verdict_bound_to_another_digest_moves_nothing(world: World, fake: FakeRegistry) -> None:
    good = world.verdict()
    world.write_verdict(image={**good["image"], "digest": "sha256:" + "d" * 64})
    before = fake.add(REPO, f"{MODEL}-verified", b'{"old": 1}')
    engine = _engine(world, fake)
    with pytest.raises(TagError, match="foreign verdict"):
        _run(world, engine, fake)
    assert fake.tags[REPO][f"{MODEL}-verified"] == before
    assert not (world.verdict_path.parent / "record.json").exists()
    assert _puts(fake) == []  # refused before the immutable tag was pushed


def test_verdict_bound_to_the_pushed_digest_is_accepted(world: World, fake: FakeRegistry) -> None:
    first = _run(world, _engine(world, fake), fake)
    good = world.verdict()
    world.write_verdict(image={**good["image"], "digest": first.digest})
    again = _run(world, _engine(world, fake), fake)
    assert again.digest == first.digest and not again.pushed


def test_registry_with_credentials_in_it_is_refused_without_echo(world: World) -> None:
    from pipeline.release.tag import target_repository

    with pytest.raises(UsageError) as e:
        target_repository(world.settings(), "bob:Secr3tPw@registry.example", None)
    assert "Secr3tPw" not in str(e.value)
    with pytest.raises(UsageError):
        target_repository(world.settings(), "https://registry.example", None)
    assert (
        str(target_repository(world.settings(), "registry.example:5000", "a/b"))
        == "registry.example:5000/a/b"
    )
    assert str(target_repository(world.settings(), None, None)) == "docker.io/rocm/atom-dev"


# ------------------------------------------------------------------ forward only, disks (issue 13.2/13.3)


def _release(fake: FakeRegistry, created: str) -> str:
    """A manifest in REPO whose image config carries `created`; its digest."""
    config = fake.add_blob(json.dumps({"config": {"Labels": {labels.OCI_CREATED: created}}}).encode())
    body = json.dumps(
        {"schemaVersion": 2, "mediaType": MEDIA_DOCKER_MANIFEST, "config": {"digest": config}, "layers": []}
    ).encode()
    return fake.add(REPO, f"release-{created[:10]}", body)


def test_a_newer_release_on_a_moving_tag_refuses_before_anything_is_pushed(
    world: World, fake: FakeRegistry
) -> None:
    newer = _release(fake, "2026-07-01T00:00:00Z")
    fake.tags[REPO][f"{MODEL}-verified"] = newer
    engine = _engine(world, fake)
    with pytest.raises(TagError) as e:
        _run(world, engine, fake)
    assert "backwards" in str(e.value) and "2026-07-01T00:00:00Z" in str(e.value)
    assert _puts(fake) == [] and fake.tags[REPO][f"{MODEL}-verified"] == newer
    result = _run(world, engine, fake, log=Logger(stream=(out := io.StringIO())), allow_older=True)
    assert fake.tags[REPO][f"{MODEL}-verified"] == result.digest and "MOVING BACK" in out.getvalue()


def test_a_newer_release_landing_between_check_and_put_is_not_overwritten(
    world: World, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conditional re-read just before the PUT: another machine released a newer image."""
    import pipeline.release.moving_tags as mt

    older = _release(fake, "2026-06-01T00:00:00Z")
    newer = _release(fake, "2026-07-01T00:00:00Z")
    fake.tags[REPO][f"{MODEL}-verified"] = older
    fake.tags[REPO]["latest"] = older
    real = mt.Mover.check_forward
    calls: list[str] = []

    def check_then_other_machine_moves(self: mt.Mover, tag: str, now: str | None) -> None:
        real(self, tag, now)
        calls.append(tag)
        if calls.count(f"{MODEL}-verified") == 2:  # 1: before the push; 2: just before the PUT
            fake.tags[REPO][f"{MODEL}-verified"] = newer
            fake.tags[REPO]["latest"] = newer

    monkeypatch.setattr(mt.Mover, "check_forward", check_then_other_machine_moves)
    with pytest.raises(TagError) as e:
        _run(world, _engine(world, fake), fake, push_latest=True)
    assert "backwards" in str(e.value) and "rolled back" in str(e.value)
    assert fake.tags[REPO][f"{MODEL}-verified"] == newer and fake.tags[REPO]["latest"] == newer
    record = json.loads((world.verdict_path.parent / "record.json").read_text())
    assert record["predicate"]["image"]["moving_tags"] == []
    assert record["predicate"]["image"]["moving_state"] == "rolled back"


def test_cli_read_only_cache_is_its_own_exit_code(
    world: World,
    fake: FakeRegistry,
    cli: FakeEngine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import errno

    from pipeline.cli import main

    real_mkdir = Path.mkdir

    def read_only(self: Path, *a: Any, **kw: Any) -> None:
        if "tag-locks" in str(self):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        real_mkdir(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(_argv(world, "--lock", str(world.lock_path))) == ExitCode.DISK
    err = capsys.readouterr().err
    assert "is read-only (EROFS)" in err and "tag-locks" in err and "Traceback" not in err
    assert _puts(fake) == []


def test_cli_dry_run_says_what_it_would_push_and_move_and_pushes_nothing(
    world: World, fake: FakeRegistry, cli: FakeEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    before = json.dumps(fake.tags, sort_keys=True, default=str)
    assert main(_argv(world, "--lock", str(world.lock_path), "--dry-run", "--push-latest")) == 0
    out = capsys.readouterr().out
    assert f"would push {REG}/{REPO}:{EXPECTED_IMMUTABLE}" in out
    assert f"would move {REG}/{REPO}:{MODEL}-verified" in out and f"would move {REG}/{REPO}:latest" in out
    assert json.dumps(fake.tags, sort_keys=True, default=str) == before  # nothing pushed or moved
    assert not list(world.verdict_path.parent.glob("record.json"))  # nothing recorded
    assert main(_argv(world, "--lock", str(world.lock_path), "--dry-run", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["push"] == f"{REG}/{REPO}:{EXPECTED_IMMUTABLE}" and data["move"] == [
        f"{REG}/{REPO}:{MODEL}-verified"
    ]
