"""pipeline.oci.engine against a real engine and real registries."""

from __future__ import annotations

import uuid
from pathlib import Path

import docker.errors
import pytest

from pipeline.errors import BuildError, InfraError, TagError
from pipeline.oci.engine import Engine

from .conftest import CASE_LABEL, TEST_LABEL, DockerCleanup, Registry


def _context(tmp_path: Path, dockerfile: str, name: str = "ctx") -> Path:
    ctx = tmp_path / name
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


def test_build_from_base_image_and_run(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    token = uuid.uuid4().hex
    ctx = _context(
        tmp_path,
        f"FROM {base_image}\nCOPY payload.txt /payload.txt\n"
        f"RUN echo {token} > /token\n"
        'CMD ["python3", "-c", "print(open(\'/payload.txt\').read().strip(), '
        "open('/token').read().strip())\"]\n",
    )
    (ctx / "payload.txt").write_text("hello from the context\n")
    lines: list[str] = []
    tag = docker_cleanup.tag("build-run")
    built = engine.build(ctx, tag=tag, labels=docker_cleanup.labels, on_line=lines.append)

    assert built.id.startswith("sha256:")
    # the classic builder appends one LABEL step per build label
    assert len(built.steps) == 4 + len(docker_cleanup.labels)
    assert built.steps[0] == f"Step 1/6 : FROM {base_image}"
    assert built.steps[2] == f"Step 3/6 : RUN echo {token} > /token"
    assert all(" : LABEL " in s for s in built.steps[4:])
    assert built.cached_steps == 0
    assert lines and "\n".join(lines) == built.log
    info = engine.image(tag)
    assert info is not None and info.id == built.id and tag in info.tags
    assert info.labels[TEST_LABEL] == docker_cleanup.labels[TEST_LABEL]

    with engine.run(tag, labels=docker_cleanup.labels) as c:
        assert c.wait(timeout=60) == 0
        assert c.logs().strip() == f"hello from the context {token}"
        assert c.exit_code() == 0
        assert c.status() == "exited"
    assert c.status() == "removed"


def test_exec_and_env_in_running_container(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup
) -> None:
    with engine.run(
        base_image, ["sleep", "60"], environment={"SECRET_VALUE": "s3cr3t-xyz"}, labels=docker_cleanup.labels
    ) as c:
        assert c.status() == "running"
        assert c.exit_code() is None
        code, out = c.exec(["python3", "-c", "import os; print(os.environ['SECRET_VALUE'][::-1])"])
        assert (code, out.strip()) == (0, "zyx-t3rc3s")
        code, out = c.exec(["sh", "-c", "echo oops >&2; exit 4"])
        assert (code, out.strip()) == (4, "oops")
        c.stop(timeout=1)
        assert c.status() == "exited"
    assert engine.containers_with_label(CASE_LABEL, docker_cleanup.case_id) == []


def test_streamed_logs_and_foreground_run(engine: Engine, base_image: str) -> None:
    script = "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)\n"
    with engine.run(base_image, ["python3", "-c", script]) as c:
        streamed = "".join(c.logs(stream=True, follow=True))
        assert streamed.split("\n")[:3] == ["line 0", "line 1", "line 2"]
        assert c.wait(timeout=30) == 0
    with engine.run(base_image, ["sh", "-c", "echo done; exit 5"], detach=False) as c:
        assert c.status() == "exited"
        assert c.exit_code() == 5
        assert c.logs() == "done\n"


def test_failing_build_names_the_step_and_keeps_the_log(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    token = uuid.uuid4().hex
    ctx = _context(
        tmp_path,
        f"FROM {base_image}\nRUN echo first-{token}\n"
        f"RUN echo about-to-fail-{token} && exit 3\nRUN echo never\n",
    )
    with pytest.raises(BuildError) as excinfo:
        engine.build(ctx, tag=docker_cleanup.tag("failing"), labels=docker_cleanup.labels)
    err = excinfo.value
    assert f"Step 3/6 : RUN echo about-to-fail-{token} && exit 3" in err.message
    assert "returned a non-zero code: 3" in err.message
    assert err.evidence is not None
    full, _, tail = err.evidence.partition("--- last lines of the failing step ---")
    assert "Step 1/6 : FROM" in full and f"first-{token}" in full
    assert f"about-to-fail-{token}" in tail and "Step 2/6" not in tail
    assert "never" not in full.replace("RUN echo never", "")
    assert err.exit_code == 7
    assert engine.image(docker_cleanup.images[0]) is None


def test_missing_dockerfile_and_bad_base_are_build_errors(
    engine: Engine, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BuildError, match="No Dockerfile"):
        engine.build(empty)
    ctx = _context(tmp_path, "FROM atom-pipeline-test/does-not-exist:0\nRUN true\n")
    with pytest.raises(BuildError, match=r"Step 1/2 : FROM atom-pipeline-test/does-not-exist:0"):
        engine.build(ctx)


def test_rebuild_reuses_the_cache_and_counts_cached_steps(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    token = uuid.uuid4().hex
    ctx = _context(
        tmp_path, f"FROM {base_image}\nRUN echo aiter-{token} > /aiter\nRUN echo atom-{token} > /atom\n"
    )
    first = engine.build(ctx, tag=docker_cleanup.tag("cache", "a"), labels=docker_cleanup.labels)
    assert first.cached_steps == 0
    second = engine.build(ctx, tag=docker_cleanup.tag("cache", "b"), labels=docker_cleanup.labels)
    assert second.id == first.id
    assert second.cached_steps == 2 + len(docker_cleanup.labels)  # the LABEL steps too
    assert second.step_was_cached(f"aiter-{token}")
    assert not second.step_was_cached("no-such-step")

    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\nRUN echo aiter-{token} > /aiter\nRUN echo atom-changed-{token} > /atom\n"
    )
    third = engine.build(ctx, tag=docker_cleanup.tag("cache", "c"), labels=docker_cleanup.labels)
    assert third.cached == [f"Step 2/5 : RUN echo aiter-{token} > /aiter"]
    assert not third.step_was_cached("atom-changed")
    assert third.id != first.id


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_container_removed_when_the_block_raises(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup, exc_type: type[BaseException]
) -> None:
    with pytest.raises(exc_type), engine.run(base_image, ["sleep", "60"], labels=docker_cleanup.labels) as c:
        cid = c.id
        assert c.status() == "running"
        raise exc_type("boom")
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(cid)


def test_failed_start_leaves_no_container(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup
) -> None:
    with pytest.raises(InfraError, match="start container"):
        engine.run(base_image, ["/no/such/binary"], labels=docker_cleanup.labels)
    assert engine.containers_with_label(CASE_LABEL, docker_cleanup.case_id) == []


def test_push_and_pull_back_by_digest(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup, registry: Registry, tmp_path: Path
) -> None:
    ctx = _context(tmp_path, f"FROM {base_image}\nRUN echo {uuid.uuid4().hex} > /id\n")
    built = engine.build(ctx, labels=docker_cleanup.labels)
    repo = registry.repo(f"atom-pipeline-test/push-{docker_cleanup.case_id}")
    engine.tag(built.id, repo, "v1")
    docker_cleanup.image(f"{repo}:v1")

    digest = engine.push(repo, "v1")
    assert digest.startswith("sha256:") and len(digest) == 71

    engine.remove_image(f"{repo}:v1")
    assert engine.image(f"{repo}:v1") is None
    pulled = engine.pull(f"{repo}@{digest}")
    docker_cleanup.image(f"{repo}@{digest}")
    assert pulled.id == built.id
    assert f"{repo}@{digest}" in pulled.digests


def test_push_to_an_unknown_tag_is_a_tag_error(engine: Engine, registry: Registry) -> None:
    with pytest.raises(TagError):
        engine.push(registry.repo("atom-pipeline-test/never-built"), "nope")


def test_push_to_a_dead_registry_is_an_infra_error(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup
) -> None:
    from .conftest import _free_port

    repo = f"127.0.0.1:{_free_port()}/atom-pipeline-test/dead-{docker_cleanup.case_id}"
    engine.tag(base_image, repo, "v1")
    docker_cleanup.image(f"{repo}:v1")
    with pytest.raises(InfraError, match="could not be reached"):
        engine.push(repo, "v1")
    with pytest.raises(InfraError, match="could not be reached to pull"):
        engine.pull(f"{repo}:v2")


def test_auth_registry_refuses_bad_credentials_without_leaking_them(
    engine: Engine, base_image: str, docker_cleanup: DockerCleanup, auth_registry: Registry
) -> None:
    repo = auth_registry.repo(f"atom-pipeline-test/auth-{docker_cleanup.case_id}")
    engine.tag(base_image, repo, "v1")
    docker_cleanup.image(f"{repo}:v1")
    assert auth_registry.password is not None and auth_registry.username is not None
    wrong = "wrong-" + auth_registry.password[::-1]

    for auth in (None, {"username": auth_registry.username, "password": wrong}):
        with pytest.raises(TagError) as excinfo:
            engine.push(repo, "v1", auth_config=auth)
        err = excinfo.value
        text = f"{err}\n{err.evidence}\n{err!r}"
        assert wrong not in text and auth_registry.password not in text
        assert any(
            w in str(err).lower()
            for w in ("unauthorized", "authentication required", "no basic auth credentials")
        )

    digest = engine.push(repo, "v1", auth_config=auth_registry.auth_config)
    assert digest.startswith("sha256:")
    engine.remove_image(f"{repo}:v1")
    with pytest.raises(TagError):
        engine.pull(f"{repo}@{digest}")
    pulled = engine.pull(f"{repo}@{digest}", auth_config=auth_registry.auth_config)
    docker_cleanup.image(f"{repo}@{digest}")
    base = engine.image(base_image)
    assert base is not None and pulled.id == base.id


def test_connect_to_nothing_says_how_to_start_dockerd(tmp_path: Path) -> None:
    with pytest.raises(InfraError) as excinfo:
        Engine.connect(f"unix://{tmp_path}/no-docker.sock")
    err = excinfo.value
    assert "No Docker engine answers" in err.message
    assert "dockerd" in str(err) and "DOCKER_HOST" in str(err)
    assert err.exit_code == 11
