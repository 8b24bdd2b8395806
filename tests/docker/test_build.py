"""Render the real templates and build them with the real engine (docker tier).

The base image is the local debootstrap image, pushed to a throwaway registry
so the lock can pin it by digest exactly as production pins the ROCm image.
aiter and ATOM are the fixture packages of tests/fixtures/build_repos.py,
whose build commands are set through the configuration.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest

from pipeline import labels
from pipeline.cli import main
from pipeline.config import Settings, load_settings
from pipeline.dockerw import Engine
from pipeline.errors import BuildError, ExitCode
from pipeline.gitw import GitRepo
from pipeline.imagebuild import BUILD_LOG, build_image
from pipeline.lock import Lock
from pipeline.log import Logger
from pipeline.render import RenderedContext, render_context
from tests.fixtures.build_repos import (
    AITER_BUILD_CMD,
    ATOM_INSTALL_CMD,
    CK_PATH,
    MODEL,
    BuildRepos,
    make_build_repos,
)

from .conftest import DockerCleanup, Registry

TEMPLATES = Path(__file__).resolve().parents[2] / "dockerfiles"
SHOW_ATOM = (
    "import atom.models.minimax_m3 as m, aiter; "
    "print(m.API); print(m.__file__); print(open('/app/aiter-test/BUILD_STAMP').read().strip()); "
    "print(open('/app/aiter-test/3rdparty/composable_kernel/include/ck.hpp').read().strip())"
)


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> BuildRepos:
    # a fresh nonce: the aiter tree is new to the engine, so the first build is cold
    return make_build_repos(tmp_path_factory.mktemp("upstreams"), nonce=uuid.uuid4().hex)


@pytest.fixture
def pinned_base(engine: Engine, base_image: str, registry: Registry, docker_cleanup: DockerCleanup) -> str:
    """The local base image as `host/name:tag@sha256:...`, pinned by the digest a registry gave it."""
    repo = registry.repo("atom-pipeline-test/base")
    engine.tag(base_image, repo, "1")
    docker_cleanup.image(f"{repo}:1")
    digest = engine.push(repo, "1")
    docker_cleanup.image(f"{repo}@{digest}")
    return f"{repo}:1@{digest}"


def settings_env(base_ref: str, case: str, **extra: str) -> dict[str, str]:
    env = {
        "PIPELINE_BASE_IMAGE": base_ref.split("@")[0],
        "PIPELINE_REPOSITORY": f"atom-pipeline-test/atom-{case}",
        "PIPELINE_AITER_BUILD_CMD": AITER_BUILD_CMD,
        "PIPELINE_ATOM_INSTALL_CMD": ATOM_INSTALL_CMD,
        "PIPELINE_TEMPLATES_DIR": str(TEMPLATES),
    }
    env.update({f"PIPELINE_{k.upper()}": v for k, v in extra.items()})
    return env


def settings(base_ref: str, case: str, tmp_path: Path, **extra: str) -> Settings:
    return load_settings(env=settings_env(base_ref, case, **extra), cwd=tmp_path)


def lock_for(repos: BuildRepos, base_ref: str, **kw: object) -> Lock:
    name, digest = base_ref.split("@")
    return repos.lock(base_ref=name, base_digest=digest, **kw)  # type: ignore[arg-type]


def render(repos: BuildRepos, s: Settings, out: Path, lock: Lock) -> RenderedContext:
    return render_context(
        lock=lock,
        atom=GitRepo(repos.atom),
        atom_tree_sha=repos.patched_sha if lock.applied_patches else repos.atom_sha,
        aiter=GitRepo(repos.aiter),
        submodule_repos={CK_PATH: GitRepo(repos.ck)},
        recipe_path=repos.recipe,
        settings=s,
        out_dir=out,
        templates_dir=TEMPLATES,
    )


def run_python(engine: Engine, image: str, code: str, cleanup: DockerCleanup) -> list[str]:
    with engine.run(image, ["python3", "-c", code], labels=cleanup.labels) as c:
        status = c.wait(timeout=60)
        out = c.logs()
    assert status == 0, out
    return out.strip().splitlines()


def test_build_labels_run_patch_only_rebuild_and_skip(
    engine: Engine, pinned_base: str, repos: BuildRepos, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    s = settings(pinned_base, docker_cleanup.case_id, tmp_path)
    log = Logger(stream=io.StringIO())
    lock1 = lock_for(repos, pinned_base)
    ctx1 = render(repos, s, tmp_path / "ctx1", lock1)

    # 1. cold build
    run1 = tmp_path / "run1"
    first = build_image(engine, ctx1.dir, tag=None, log=log, run_dir=run1, extra_labels=docker_cleanup.labels)
    assert not first.skipped and first.aiter_cached is False
    assert first.log_path == run1 / BUILD_LOG and "Step 1/" in first.log_path.read_text()
    assert isinstance(log.stream, io.StringIO)
    assert "step 1/" in log.stream.getvalue() and "RUN python3 build_aiter.py" in log.stream.getvalue()
    info = engine.image(ctx1.image_ref)
    assert info is not None and info.id == first.image_id
    lab = info.labels
    for key, value in ctx1.labels.items():
        assert lab[key] == value, key
    assert lab[labels.INPUTS_DIGEST] == ctx1.inputs_digest
    assert lab[labels.ATOM_SHA] == repos.atom_sha and lab[labels.AITER_SHA] == repos.aiter_sha
    assert json.loads(lab[labels.PATCHES]) == [{"name": repos.patch_name, "sha256": repos.patch_sha256}]
    assert lab[labels.OCI_BASE_DIGEST] == pinned_base.split("@")[1]
    assert lab[labels.OCI_CREATED] == "2026-06-24T09:12:00Z"
    assert lab[labels.RECIPE] == f"{MODEL}.yaml"

    # the patched ATOM is what is installed; aiter has its submodule
    api, path, stamp1, ck = run_python(engine, ctx1.image_ref, SHOW_ATOM, docker_cleanup)
    assert api == "split-kv-cache" and path == "/app/ATOM/atom/models/minimax_m3.py"
    assert ck == "// composable_kernel fixture"

    # 2. patch-only change: the aiter stage comes from the cache
    repos2 = repos.repatch("-v2")
    ctx2 = render(repos2, s, tmp_path / "ctx2", lock_for(repos2, pinned_base))
    assert ctx2.inputs_digest != ctx1.inputs_digest
    second = build_image(
        engine, ctx2.dir, tag=None, log=log, run_dir=tmp_path / "run2", extra_labels=docker_cleanup.labels
    )
    assert not second.skipped and second.aiter_cached is True and second.image_id != first.image_id
    api2, _, stamp2, _ = run_python(engine, ctx2.image_ref, SHOW_ATOM, docker_cleanup)
    assert api2 == "split-kv-cache-v2"
    assert stamp2 == stamp1  # the aiter build step did not run again

    # 3. nothing changed: no build at all, the existing image is reported
    third = build_image(engine, ctx2.dir, tag=None, log=log, run_dir=tmp_path / "run3")
    assert third.skipped and third.image_id == second.image_id and third.log_path is None
    assert not (tmp_path / "run3" / BUILD_LOG).exists()


def test_hostile_ref_is_a_label_value_never_a_command(
    engine: Engine, pinned_base: str, repos: BuildRepos, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    evil = 'main; touch /pwned; $(touch /pwned2) `touch /pwned3` "x\\y'
    s = settings(pinned_base, docker_cleanup.case_id, tmp_path)
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base, atom_url=evil))
    log = Logger(stream=io.StringIO())
    out = build_image(
        engine, ctx.dir, tag=None, log=log, run_dir=tmp_path, extra_labels=docker_cleanup.labels
    )
    info = engine.image(out.image_id)
    assert info is not None and info.labels["org.atom-image-pipeline.atom.url"] == evil
    code = "import os; print([p for p in ('/pwned', '/pwned2', '/pwned3') if os.path.exists(p)])"
    assert run_python(engine, out.image_id, code, docker_cleanup) == ["[]"]


def test_failing_build_shows_step_and_tail_and_tags_nothing(
    engine: Engine, pinned_base: str, repos: BuildRepos, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    failing = "python3 -c \"import sys; print('aiter-kernel-compile-failed-here'); sys.exit(3)\""
    s = settings(pinned_base, docker_cleanup.case_id, tmp_path, aiter_build_cmd=failing)
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base))
    log = Logger(stream=io.StringIO())
    with pytest.raises(BuildError) as e:
        build_image(
            engine, ctx.dir, tag=None, log=log, run_dir=tmp_path / "run", extra_labels=docker_cleanup.labels
        )
    text = str(e.value)
    assert f"RUN {failing}" in text and "aiter-kernel-compile-failed-here" in text
    assert "Nothing was tagged" in text and str(tmp_path / "run" / BUILD_LOG) in text
    assert "aiter-kernel-compile-failed-here" in (tmp_path / "run" / BUILD_LOG).read_text()
    assert engine.image(ctx.image_ref) is None
    assert engine.images_with_label(labels.INPUTS_DIGEST, ctx.inputs_digest) == []


def test_absent_base_image_names_image_and_digest(
    engine: Engine, repos: BuildRepos, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    digest = "sha256:" + "0" * 64
    base = f"127.0.0.1:9/atom-pipeline-test/no-such-base:1@{digest}"  # port 9: nothing listens
    s = settings(base, docker_cleanup.case_id, tmp_path)
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, base))
    log = Logger(stream=io.StringIO())
    with pytest.raises(BuildError) as e:
        build_image(engine, ctx.dir, tag=None, log=log, run_dir=tmp_path / "run")
    assert "127.0.0.1:9/atom-pipeline-test/no-such-base" in str(e.value) and digest in str(e.value)
    assert e.value.exit_code == ExitCode.BUILD


def test_cli_render_then_build_then_skip_and_unreachable_engine(
    engine: Engine,
    pinned_base: str,
    repos: BuildRepos,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    for key, value in settings_env(pinned_base, docker_cleanup.case_id).items():
        monkeypatch.setenv(key, value)
    lock_path = tmp_path / "locks" / f"{MODEL}.toml"
    lock_for(repos, pinned_base).save(lock_path)
    argv = [
        *("render", "--model", MODEL, "-o", str(tmp_path / "ctx"), "--json"),
        *("--atom-repo", str(repos.atom), "--aiter-repo", str(repos.aiter)),
        *("--atom-tree", repos.patched_sha, "--submodule-repo", f"{CK_PATH}={repos.ck}"),
        *("--recipe", str(repos.recipe)),
    ]
    assert main(argv) == 0
    rendered = json.loads(capsys.readouterr().out)
    ref = rendered["image_ref"]
    docker_cleanup.image(ref)

    # a build through the CLI (the test's cleanup label cannot be passed there: the tag is registered)
    assert main(["build", "--context", str(tmp_path / "ctx"), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["skipped"] is False and built["image_ref"] == ref
    assert Path(built["log"]).is_file() and Path(built["log"]).parent.parent == tmp_path / "runs"
    docker_cleanup.image(built["image_id"])

    assert main(["build", "--context", str(tmp_path / "ctx"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["skipped"] is True and again["image_id"] == built["image_id"]

    code = main(
        ["build", "--context", str(tmp_path / "ctx"), "--docker-host", "unix:///nonexistent/docker.sock"]
    )
    err = capsys.readouterr().err
    assert code == ExitCode.INFRA and "DOCKER_HOST" in err and "dockerd" in err


def test_image_in_target_registry_is_not_rebuilt(
    engine: Engine,
    pinned_base: str,
    registry: Registry,
    repos: BuildRepos,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    case = docker_cleanup.case_id
    s = settings(pinned_base, case, tmp_path)
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base, atom_ref=f"registry-{case}"))
    log = Logger(stream=io.StringIO())
    built = build_image(
        engine, ctx.dir, tag=None, log=log, run_dir=tmp_path, extra_labels=docker_cleanup.labels
    )
    remote_repo = registry.repo(s.image.repository)
    remote_tag = ctx.image_ref.rsplit(":", 1)[1]
    engine.tag(built.image_id, remote_repo, remote_tag)
    digest = engine.push(remote_repo, remote_tag)
    for ref in (f"{remote_repo}:{remote_tag}", ctx.image_ref):
        engine.remove_image(ref, force=True)
    assert engine.images_with_label(labels.INPUTS_DIGEST, ctx.inputs_digest) == []

    monkeypatch.chdir(tmp_path)
    for key, value in settings_env(pinned_base, case, registry=registry.host).items():
        monkeypatch.setenv(key, value)
    assert main(["build", "--context", str(ctx.dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["skipped"] is True and out["found_in"] == f"{remote_repo}:{remote_tag}@{digest}"
    # nothing was built: the registry's image was pulled, so smoke and tag get a real image ID
    assert out["image_id"] == built.image_id
    pulled = engine.image(ctx.image_ref)
    assert pulled is not None and pulled.id == built.image_id
