"""`pipeline smoke --image REPO:TAG`: the tag is resolved to a digest once, and that digest is used
from then on (issue 27 §3): started, recorded, handed to tag on a resume. The in-memory registry."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests

from pipeline.config import load_settings
from pipeline.log import Logger
from pipeline.oci.engine import ImageInfo
from pipeline.oci.registry import MEDIA_DOCKER_MANIFEST, RegistryClient
from pipeline.stages import smoke
from pipeline.stages import tag as tag_stage
from pipeline.stages.base import Context
from tests.fixtures.registry_fake import FakeRegistry, fake_session

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "MiniMax-M3-MXFP4.yaml"
REG = "127.0.0.1:5000"
REPO = "rocm/atom-dev"
TESTED_ID = "sha256:" + "1" * 64
OTHER_ID = "sha256:" + "2" * 64


def _manifest(image_id: str) -> bytes:
    return json.dumps(
        {"schemaVersion": 2, "mediaType": MEDIA_DOCKER_MANIFEST, "config": {"digest": image_id}}
    ).encode()


class FakeEngine:
    """Images by reference; `REPO@digest` answers with the image that digest is."""

    docker_host = None

    def __init__(self, images: dict[str, ImageInfo]) -> None:
        self.images = images

    def image(self, ref: str) -> ImageInfo | None:
        if ref in self.images:
            return self.images[ref]
        return next((i for i in self.images.values() if ref == i.id or ref in i.digests), None)

    def close(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRegistry:
    registry = FakeRegistry()
    real_init = RegistryClient.__init__

    def init(self: RegistryClient, host: str, **kw: Any) -> None:
        kw.update(session=fake_session(registry), sleep=lambda s: None)
        real_init(self, host, **kw)

    monkeypatch.setattr(RegistryClient, "__init__", init)
    return registry


def _ctx(tmp_path: Path) -> tuple[Context, io.StringIO]:
    out = io.StringIO()
    settings = load_settings(env={"PIPELINE_CACHE_DIR": str(tmp_path / "cache")}, cwd=tmp_path)
    return Context(settings=settings, log=Logger(stream=out), env={}, work_dir=tmp_path), out


def test_a_tag_with_a_registry_is_its_manifest_digest_there_not_the_engine_s_local_tag(
    tmp_path: Path, fake: FakeRegistry
) -> None:
    tested = fake.add(REPO, "candidate-1", _manifest(TESTED_ID))
    # the engine's own candidate-1 is an older image: the registry's digest wins, it is pulled by it
    engine = FakeEngine({f"{REG}/{REPO}:candidate-1": ImageInfo(OTHER_ID, [], [], {}, "")})
    ctx, out = _ctx(tmp_path)
    assert smoke.by_digest(ctx, engine, f"{REG}/{REPO}:candidate-1") == f"{REG}/{REPO}@{tested}"  # type: ignore[arg-type]
    assert f"is {REG}/{REPO}@{tested} in its registry" in out.getvalue()


def test_a_local_name_is_the_engine_s_digest_of_that_repository_else_its_image_id(
    tmp_path: Path, fake: FakeRegistry
) -> None:
    pushed = "sha256:" + "3" * 64
    engine = FakeEngine(
        {
            "atom:test": ImageInfo(
                TESTED_ID, ["atom:test"], [f"elsewhere/x@{pushed}", f"atom@{pushed}"], {}, ""
            ),
            "atom:local": ImageInfo(OTHER_ID, ["atom:local"], [f"elsewhere/x@{pushed}"], {}, ""),
        }
    )
    ctx, _ = _ctx(tmp_path)
    assert smoke.by_digest(ctx, engine, "atom:test") == f"docker.io/library/atom@{pushed}"  # type: ignore[arg-type]
    assert smoke.by_digest(ctx, engine, "atom:local") == OTHER_ID  # type: ignore[arg-type]
    # given by digest or ID: as given; Docker Hub is never asked
    assert smoke.by_digest(ctx, engine, f"{REG}/{REPO}@{pushed}") == f"{REG}/{REPO}@{pushed}"  # type: ignore[arg-type]
    assert smoke.by_digest(ctx, engine, TESTED_ID) == TESTED_ID  # type: ignore[arg-type]
    assert fake.log == []


def test_a_registry_that_does_not_answer_is_said_and_the_engine_s_image_used(
    tmp_path: Path, fake: FakeRegistry
) -> None:
    fake.fail = [requests.ConnectionError("Connection refused")] * 10
    pushed = "sha256:" + "4" * 64
    engine = FakeEngine(
        {f"{REG}/{REPO}:candidate-1": ImageInfo(TESTED_ID, [], [f"{REG}/{REPO}@{pushed}"], {}, "")}
    )
    ctx, out = _ctx(tmp_path)
    assert smoke.by_digest(ctx, engine, f"{REG}/{REPO}:candidate-1") == f"{REG}/{REPO}@{pushed}"  # type: ignore[arg-type]
    assert f"could not ask {REG} for {REG}/{REPO}:candidate-1" in out.getvalue()


def test_the_tag_overwritten_after_resolution_changes_nothing_run_recorded_or_tagged(
    tmp_path: Path, fake: FakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tag moves to another image once the smoke test started: the container, the stage's record
    and the tag stage of a resume all act on the digest resolved at the start."""
    import pipeline.smoke

    tested = fake.add(REPO, "candidate-1", _manifest(TESTED_ID))
    pinned = f"{REG}/{REPO}@{tested}"
    engine = FakeEngine({pinned: ImageInfo(TESTED_ID, [], [pinned], {}, "")})
    monkeypatch.setattr("pipeline.stages.base.Context.engine", lambda self, host="": engine)
    started: list[str] = []

    def run_smoke(engine_: FakeEngine, *, image: str, **kw: Any) -> Any:
        moved = fake.add(REPO, "candidate-1", _manifest(OTHER_ID))  # overwritten meanwhile
        assert moved != tested
        started.append(image)
        (kw["run_dir"] / "verdict.json").parent.mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(passed=True, reason="all checks passed")

    monkeypatch.setattr(pipeline.smoke, "run_smoke", run_smoke)
    ctx, _ = _ctx(tmp_path)
    inputs = smoke.Inputs(
        image=f"{REG}/{REPO}:candidate-1", model="MiniMax-M3-MXFP4", recipe=RECIPE, out_dir=tmp_path / "smoke"
    )
    out = smoke.run(ctx, inputs)
    assert started == [pinned]
    assert out.image == pinned and out.resolved_from == f"{REG}/{REPO}:candidate-1"
    # a resume's tag stage takes the recorded digest, whatever the tag holds now
    built = SimpleNamespace(candidate="", image=TESTED_ID, ref=f"{REG}/{REPO}:candidate-1", attestations=None)
    rendered = SimpleNamespace(inputs_digest="sha256:" + "5" * 64)

    class Up:
        def get(self, name: str, _cls: Any) -> Any:
            return {"build": built, "smoke": out, "render": rendered}[name]

    spec = SimpleNamespace(recipe_path=RECIPE, registry=REG, model="MiniMax-M3-MXFP4")
    planned = tag_stage.plan(ctx, spec, Up())  # type: ignore[arg-type]
    assert planned.image == pinned
