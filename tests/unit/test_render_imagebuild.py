"""imagebuild logic without an engine: skip decisions, stage cache detection, failure text."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from pipeline import labels
from pipeline.config import load_settings
from pipeline.errors import BuildError, RenderError
from pipeline.fsutil import sha256_bytes
from pipeline.image.build import _failure, build_image, stage_cached
from pipeline.image.context import MANIFEST
from pipeline.log import Logger
from pipeline.oci.engine import BuiltImage, ImageInfo
from pipeline.oci.ref import split_ref

DIGEST = "d" * 64
SETTINGS = load_settings(env={}, cwd=Path(__file__).parent)  # the packaged defaults


def context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    dockerfile = "FROM x@sha256:" + "1" * 64 + "\n"
    (ctx / "Dockerfile").write_text(dockerfile)
    manifest = {
        "inputs_digest": DIGEST,
        "image_ref": "rocm/atom-dev:candidate-" + DIGEST[:12],
        "labels": {labels.INPUTS_DIGEST: DIGEST},
        "dockerfile_sha256": sha256_bytes(dockerfile.encode()),
        "base_image": "x@sha256:" + "1" * 64,
    }
    (ctx / MANIFEST).write_text(json.dumps(manifest))
    return ctx


class FakeEngine:
    def __init__(self, existing: list[ImageInfo]) -> None:
        self.existing = existing
        self.tagged: list[tuple[str, str, str]] = []
        self.built = False

    def images_with_label(self, key: str, value: str) -> list[ImageInfo]:
        assert key == labels.INPUTS_DIGEST
        return [i for i in self.existing if i.labels.get(key) == value]

    def tag(self, image: str, repo: str, tag: str) -> None:
        self.tagged.append((image, repo, tag))

    def pull(self, ref: str, auth_config: Any = None) -> ImageInfo:
        self.pulled = ref
        return ImageInfo(id="sha256:" + "c" * 64, tags=[], digests=[ref], labels={}, created="")

    def build(self, *args: Any, **kwargs: Any) -> BuiltImage:
        self.built = True
        raise AssertionError("must not build")


def test_existing_image_with_same_digest_is_reported_and_tagged(tmp_path: Path) -> None:
    info = ImageInfo(
        id="sha256:" + "a" * 64, tags=[], digests=[], labels={labels.INPUTS_DIGEST: DIGEST}, created=""
    )
    engine = FakeEngine([info])
    out = build_image(
        engine,
        context(tmp_path),
        tag=None,
        log=Logger(stream=io.StringIO()),
        run_dir=tmp_path,
        settings=SETTINGS,
        env={},
    )  # type: ignore[arg-type]
    assert out.skipped and out.image_id == info.id and out.found_in == "local" and not engine.built
    assert engine.tagged == [(info.id, "rocm/atom-dev", "candidate-" + DIGEST[:12])]
    assert not (tmp_path / "build.log").exists()


def test_registry_hit_skips_the_build(tmp_path: Path) -> None:
    engine = FakeEngine([])
    out = build_image(
        engine,  # type: ignore[arg-type]
        context(tmp_path),
        tag="my/repo:x",
        log=Logger(stream=io.StringIO()),
        run_dir=tmp_path,
        settings=SETTINGS,
        env={},
        remote_lookup=lambda d: f"reg/my/repo:candidate-{d[:12]}@sha256:" + "b" * 64,
    )
    assert out.skipped and out.found_in.startswith("reg/my/repo:candidate-dddddddddddd") and not engine.built


def test_edited_context_is_refused_before_engine_work(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    (ctx / "Dockerfile").write_text("FROM evil\n")
    with pytest.raises(RenderError, match="edited after render"):
        build_image(
            FakeEngine([]),
            ctx,
            tag=None,
            log=Logger(stream=io.StringIO()),
            run_dir=None,
            settings=SETTINGS,
            env={},
        )  # type: ignore[arg-type]


def test_stage_cached() -> None:
    steps = [
        "Step 1/7 : FROM base@sha256:1 AS base",
        "Step 2/7 : FROM base AS aiter",
        "Step 3/7 : COPY aiter/ /app/aiter-test/",
        "Step 4/7 : RUN python3 setup.py develop",
        "Step 5/7 : FROM aiter AS atom",
        "Step 6/7 : COPY atom/ /app/ATOM/",
        "Step 7/7 : RUN pip install -e .",
    ]
    warm = BuiltImage(id="x", log="", steps=steps, cached=steps[2:4])
    cold = BuiltImage(id="x", log="", steps=steps, cached=steps[2:3])
    assert stage_cached(warm, "aiter") is True
    assert stage_cached(cold, "aiter") is False
    assert stage_cached(warm, "nope") is None


def test_split_ref() -> None:
    assert split_ref("127.0.0.1:5000/a/b:candidate-1") == ("127.0.0.1:5000/a/b", "candidate-1")
    assert split_ref("127.0.0.1:5000/a/b") == ("127.0.0.1:5000/a/b", "latest")
    with pytest.raises(BuildError):
        split_ref("a/b@sha256:" + "0" * 64)


def test_failure_message_has_step_tail_and_log_path(tmp_path: Path) -> None:
    err = BuildError(
        "The image build of x failed at Step 4/7 : RUN make: exit 2",
        evidence="...full log...\n\n--- last lines of the failing step ---\n"
        "Step 4/7 : RUN make\ncc: error: boom\n",
    )
    out = _failure(err, tmp_path / "build.log")
    text = str(out)
    assert "Step 4/7 : RUN make" in text and "cc: error: boom" in text
    assert "Nothing was tagged" in text and str(tmp_path / "build.log") in text
