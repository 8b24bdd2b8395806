"""The image by digest between hosts (issue 27 §3), with a real registry and a second, empty dockerd.

Host A builds and pushes a candidate; its tag in the registry is then overwritten with another
image. Host B (the second engine) is handed the candidate by digest: the smoke stage pulls exactly
that digest and verifies it before starting anything, whatever the tag now holds.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path

from pipeline.config import load_settings
from pipeline.log import Logger
from pipeline.oci.engine import Engine
from pipeline.stages import smoke
from pipeline.stages.base import Context
from pipeline.stages.build import by_digest
from tests.fixtures.second_engine import second_dockerd

from .conftest import DockerCleanup, Registry


def _push(engine: Engine, base: str, repo: str, tag: str, cleanup: DockerCleanup, tmp_path: Path) -> str:
    """Build a one-file image FROM the base, push it as repo:tag; its `repo@sha256:…`."""
    ctx = tmp_path / f"ctx-{uuid.uuid4().hex[:6]}"
    ctx.mkdir()
    (ctx / "marker").write_text(uuid.uuid4().hex)
    (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY marker /marker\n")
    built = engine.build(ctx, tag=f"{repo}:{tag}", labels=cleanup.labels)
    digest = engine.push(repo, tag)
    return by_digest(f"{repo}:{tag}@{digest}", "", built.id)


def test_smoke_on_another_engine_pulls_the_candidate_by_digest_not_by_its_moved_tag(
    engine: Engine, base_image: str, registry: Registry, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    repo = f"{registry.host}/atom-pipeline-test/custody-{docker_cleanup.case_id}"
    candidate = _push(engine, base_image, repo, "candidate-1", docker_cleanup, tmp_path)
    assert candidate.startswith(f"{repo}@sha256:")
    # the tag is overwritten with another image between build and smoke
    other = _push(engine, base_image, repo, "candidate-1", docker_cleanup, tmp_path)
    assert other != candidate

    settings = load_settings(env={"PIPELINE_CACHE_DIR": str(tmp_path / "cache")}, cwd=tmp_path)
    out = io.StringIO()
    log = Logger(stream=out)
    with second_dockerd() as (host_b, _):
        ctx = Context(settings=settings, log=log, env={}, work_dir=tmp_path)
        assert host_b.image(candidate) is None  # an empty engine
        assert smoke.on_engine(ctx, host_b, candidate) == candidate
        info = host_b.image(candidate)
        assert info is not None and candidate in info.digests
        assert host_b.image(f"{repo}:candidate-1") is None  # pulled by digest, not by the moved tag
        assert "pulling it by digest" in out.getvalue()
        # present now: used as it is, not pulled again
        out.truncate(0)
        assert smoke.on_engine(ctx, host_b, candidate) == candidate
        assert "pulling" not in out.getvalue()


def test_smoke_given_a_tag_resolves_it_once_and_runs_that_digest_after_the_tag_moved(
    engine: Engine, base_image: str, registry: Registry, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    """`pipeline smoke --image REPO:TAG` on host B: the registry's digest for the tag, asked once at
    the start; the tag overwritten afterwards changes nothing that host B pulls and starts."""
    repo = f"{registry.host}/atom-pipeline-test/resolve-{docker_cleanup.case_id}"
    candidate = _push(engine, base_image, repo, "candidate-1", docker_cleanup, tmp_path)
    settings = load_settings(env={"PIPELINE_CACHE_DIR": str(tmp_path / "cache")}, cwd=tmp_path)
    out = io.StringIO()
    with second_dockerd() as (host_b, _):
        ctx = Context(settings=settings, log=Logger(stream=out), env={}, work_dir=tmp_path)
        pinned = smoke.by_digest(ctx, host_b, f"{repo}:candidate-1")
        assert pinned == candidate and f"is {candidate} in its registry" in out.getvalue()
        # the tag moves to another image after the resolution
        other = _push(engine, base_image, repo, "candidate-1", docker_cleanup, tmp_path)
        assert other != candidate
        assert smoke.on_engine(ctx, host_b, pinned) == candidate
        info = host_b.image(candidate)
        assert info is not None and candidate in info.digests
        assert host_b.image(other) is None and host_b.image(f"{repo}:candidate-1") is None
