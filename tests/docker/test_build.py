"""Render the real templates and build them with the real engine (docker tier).

The base image is the local debootstrap image, pushed to a throwaway registry
so the lock can pin it by digest exactly as production pins the ROCm image.
aiter and ATOM are the fixture packages of tests/fixtures/build_repos.py,
whose build commands are set through the configuration. Images install
lm-eval from the real wheelhouse (`scripts/setup.sh wheelhouse`), offline.

Builds go through BuildKit (the engine's own, driven by /usr/bin/docker) unless a
test asks for the classic builder; every candidate passes the image self-check
first, and the tests below build images that break each of its rules.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import labels
from pipeline.cli import main
from pipeline.config import Settings, load_settings
from pipeline.errors import BuildError, ExitCode
from pipeline.gitw import GitRepo
from pipeline.image.build import BUILD_LOG, BuildOutcome, aiter_cache_tag, build_image
from pipeline.image.buildprogress import timings_path
from pipeline.image.context import RenderedContext, read_manifest
from pipeline.image.render import render_context
from pipeline.image.selfcheck import SelfCheckError
from pipeline.lock import Lock, PatchPin
from pipeline.log import Logger
from pipeline.oci.engine import Engine
from pipeline.oci.registry import RegistryClient
from tests.fixtures.build_repos import (
    AITER_BUILD_CMD,
    ATOM_INSTALL_CMD,
    CK_PATH,
    MODEL,
    TEST_BASE_PYTHON,
    BuildRepos,
    fake_wheelhouse,
    make_build_repos,
    test_wheelhouse,
    write_series,
)
from tests.fixtures.second_engine import second_dockerd

from .conftest import DockerCleanup, Registry, _start_registry

TEMPLATES = Path(__file__).resolve().parents[2] / "dockerfiles"
# The cache (mirrors, one build directory per model) every test of this module shares, so BuildKit
# sends only what changed; it lives in this session's pytest temp dir (`_build_cache`), never in a
# directory another run on the machine shares (same TMPDIR or not), which would race with this one.
CACHE_ROOT: list[Path] = []
SHOW_ATOM = (
    "import atom.models.minimax_m3 as m, aiter; "
    "print(m.API); print(m.__file__); print(open('/app/aiter-test/BUILD_STAMP').read().strip()); "
    "print(open('/app/aiter-test/3rdparty/composable_kernel/include/ck.hpp').read().strip())"
)


@pytest.fixture(scope="module", autouse=True)
def _build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    CACHE_ROOT[:] = [tmp_path_factory.mktemp("build-cache")]
    yield CACHE_ROOT[0]
    CACHE_ROOT.clear()


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> BuildRepos:
    # a fresh nonce: the aiter tree is new to the engine, so the first build is cold
    return make_build_repos(tmp_path_factory.mktemp("upstreams"), nonce=uuid.uuid4().hex)


@pytest.fixture(scope="module")
def base_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """One registry for the module: it holds the pinned base image (pushed once) and the caches."""
    with _start_registry(tmp_path_factory.mktemp("base-registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def pinned_base(engine: Engine, base_image: str, base_registry: Registry) -> Iterator[str]:
    """The local base image as `host/name:tag@sha256:...`, pinned by the digest a registry gave it.

    Pushed once per module; both references are removed at the end, and a reference that cannot
    be removed fails the module (no `127.0.0.1:PORT/atom-pipeline-test/base` is ever left behind).
    """
    repo = base_registry.repo("atom-pipeline-test/base")
    engine.tag(base_image, repo, "1")
    refs = [f"{repo}:1"]
    try:
        digest = engine.push(repo, "1")
        refs.append(f"{repo}@{digest}")
        yield f"{repo}:1@{digest}"
    finally:
        left = []
        for ref in reversed(refs):
            engine.remove_image(ref)
            if engine.image(ref) is not None:
                left.append(ref)
        assert not left, f"could not remove {left}"


@pytest.fixture
def registry(base_registry: Registry) -> Registry:
    return base_registry


def settings_env(base_ref: str, case: str, **extra: str) -> dict[str, str]:
    env = {
        "PIPELINE_BASE_IMAGE": base_ref.split("@")[0],
        "PIPELINE_REPOSITORY": f"atom-pipeline-test/atom-{case}",
        "PIPELINE_AITER_BUILD_CMD": AITER_BUILD_CMD,
        "PIPELINE_ATOM_INSTALL_CMD": ATOM_INSTALL_CMD,
        "PIPELINE_TEMPLATES_DIR": str(TEMPLATES),
        "PIPELINE_WHEELS_DIR": str(test_wheelhouse()),
        "PIPELINE_PYTHON_VERSION": TEST_BASE_PYTHON,
        "PIPELINE_OFFLINE_BUILD": "1",
        "PIPELINE_REQUIRE_GIT": "0",  # the debootstrap minbase image has no git
        # one build directory per model for every test: BuildKit sends only what changed
        "PIPELINE_CACHE_DIR": str(CACHE_ROOT[0]),
    }
    env.update({f"PIPELINE_{k.upper()}": v for k, v in extra.items()})
    return env


def settings(base_ref: str, case: str, tmp_path: Path, **extra: str) -> Settings:
    return load_settings(env=settings_env(base_ref, case, **extra), cwd=tmp_path)


def lock_for(repos: BuildRepos, base_ref: str, **kw: object) -> Lock:
    name, digest = base_ref.split("@")
    return repos.lock(base_ref=name, base_digest=digest, **kw)  # type: ignore[arg-type]


def build(
    engine: Engine,
    ctx: Path,
    s: Settings,
    run_dir: Path,
    cleanup: DockerCleanup,
    log: Logger | None = None,
    **kw: object,
) -> BuildOutcome:
    """build_image of `ctx` into `run_dir`, its image labelled for `cleanup` (`log`: a quiet one)."""
    env = kw.pop("env", os.environ)
    return build_image(
        engine,
        ctx,
        tag=None,
        log=log if log is not None else Logger(stream=io.StringIO()),
        run_dir=run_dir,
        extra_labels=cleanup.labels,
        settings=s,
        env=env,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def render(
    repos: BuildRepos, s: Settings, out: Path, lock: Lock, recipe: Path | None = None
) -> RenderedContext:
    return render_context(
        lock=lock,
        atom=GitRepo(repos.atom),
        atom_tree_sha=repos.patched_sha if lock.applied_patches else repos.atom_sha,
        aiter=GitRepo(repos.aiter),
        submodule_repos={CK_PATH: GitRepo(repos.ck)},
        recipe_path=recipe or repos.recipe,
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
    first = build(engine, ctx1.dir, s, run1, docker_cleanup, log)
    assert not first.skipped and first.aiter_cached is False
    assert first.builder.startswith("buildkit")
    assert first.log_path == run1 / BUILD_LOG and "[aiter 5/5] RUN" in first.log_path.read_text()
    assert isinstance(log.stream, io.StringIO)
    assert "[aiter 5/5] RUN python3 build_aiter.py" in log.stream.getvalue()
    assert "image self-check passed" in log.stream.getvalue()
    # each step's time is kept for the next build's progress ("against the last build's time")
    times = timings_path(s.cache_dir, MODEL)
    aiter_step = next(k for k in json.loads(times.read_text())["steps"] if k.startswith("[aiter 5/5] RUN"))
    aiter_s = json.loads(times.read_text())["steps"][aiter_step]
    assert aiter_s > 0
    report = json.loads((run1 / "selfcheck.json").read_text())
    assert report["ok"] is True and report["facts"]["dists"]["lm-eval"][0]["version"] == "0.4.13"
    assert report["facts"]["compat"]["installed"] == report["facts"]["compat"]["pre_build"]
    assert "not produced" in json.loads((run1 / "attestations.json").read_text())["note"]
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
    # the image names no model or recipe (one image serves every model of its pair)
    assert labels.MODEL not in lab and labels.RECIPE not in lab and MODEL not in lab[labels.OCI_TITLE]
    assert lab[labels.PAIR_DIGEST] == ctx1.labels[labels.PAIR_DIGEST]
    assert lab["org.atom-image-pipeline.lm-eval.version"] == "0.4.13"

    # the patched ATOM is what is installed; aiter has its submodule
    api, path, stamp1, ck = run_python(engine, ctx1.image_ref, SHOW_ATOM, docker_cleanup)
    assert api == "split-kv-cache" and path == "/app/ATOM/atom/models/minimax_m3.py"
    assert ck == "// composable_kernel fixture"

    # 2. patch-only change: the aiter stage comes from the cache
    repos2 = repos.repatch("-v2")
    ctx2 = render(repos2, s, tmp_path / "ctx2", lock_for(repos2, pinned_base))
    assert ctx2.inputs_digest != ctx1.inputs_digest
    second = build(engine, ctx2.dir, s, tmp_path / "run2", docker_cleanup, log)
    assert not second.skipped and second.aiter_cached is True and second.image_id != first.image_id
    assert json.loads(times.read_text())["steps"][aiter_step] == aiter_s  # from cache: the real time kept
    shown = log.stream.getvalue().split("image self-check passed", 1)[1]  # the second build's lines
    assert "  … build: " in shown and "(last build " in shown
    # BuildKit sent only what changed (the patched file, the lock), not the trees and the wheelhouse
    # (against the context's size on disk, not the first transfer: the shared build directory
    # outlives this test, so an earlier run may already have sent the first context)
    assert second.context_bytes is not None
    full = sum(f.stat().st_size for f in ctx2.dir.rglob("*") if f.is_file())
    assert second.context_bytes < full / 100, (second.context_bytes, full)
    api2, _, stamp2, _ = run_python(engine, ctx2.image_ref, SHOW_ATOM, docker_cleanup)
    assert api2 == "split-kv-cache-v2"
    assert stamp2 == stamp1  # the aiter build step did not run again

    # 3. nothing changed: no build at all, the existing image is reported
    third = build_image(
        engine, ctx2.dir, tag=None, log=log, run_dir=tmp_path / "run3", settings=s, env=os.environ
    )
    assert third.skipped and third.image_id == second.image_id and third.log_path is None
    assert not (tmp_path / "run3" / BUILD_LOG).exists()

    # 4. another model whose lock pins the same pair: the same image, found, not built; the model's
    #    part of the self-check (its recipe's tools) runs on it, and a missing tool stops that model
    #    only: the image is kept for the models it serves
    lock2 = lock_for(repos2, pinned_base)
    text = repos.recipe.read_text()
    for other, tool in (("Other-Model", "lm_eval"), ("Toolless-Model", "no-such-eval")):
        recipe = tmp_path / f"{other}.yaml"
        recipe.write_text(text.replace(f"name: {MODEL}", f"name: {other}").replace("[lm_eval,", f"[{tool},"))
        ctx = render(repos2, s, tmp_path / f"ctx-{other}", lock2.model_copy(update={"model": other}), recipe)
        assert ctx.inputs_digest == ctx2.inputs_digest and ctx.image_ref == ctx2.image_ref
        out = io.StringIO()
        if tool == "lm_eval":
            found = build_image(
                engine, ctx.dir, tag=None, log=Logger(stream=out), run_dir=None, settings=s, env=os.environ
            )
            assert found.skipped and found.image_id == second.image_id
            assert f"{other}'s recipe tools are in" in out.getvalue() and "lm_eval" in out.getvalue()
        else:
            with pytest.raises(SelfCheckError) as e:
                build_image(
                    engine,
                    ctx.dir,
                    tag=None,
                    log=Logger(stream=out),
                    run_dir=None,
                    settings=s,
                    env=os.environ,
                )
            assert "`no-such-eval` is not in the image" in str(e.value) and other in str(e.value)
            assert engine.image(second.image_id) is not None  # kept: it serves the other models


def test_hostile_ref_is_a_label_value_never_a_command(
    engine: Engine, pinned_base: str, repos: BuildRepos, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    evil = 'main; touch /pwned; $(touch /pwned2) `touch /pwned3` "x\\y'
    s = settings(pinned_base, docker_cleanup.case_id, tmp_path)
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base, atom_url=evil))
    log = Logger(stream=io.StringIO())
    out = build(engine, ctx.dir, s, tmp_path, docker_cleanup, log)
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
        build(engine, ctx.dir, s, tmp_path / "run", docker_cleanup, log)
    text = str(e.value)
    assert f"RUN {failing}" in text and "aiter-kernel-compile-failed-here" in text
    assert "Nothing was tagged" in text and str(tmp_path / "run" / BUILD_LOG) in text
    assert "aiter-kernel-compile-failed-here" in (tmp_path / "run" / BUILD_LOG).read_text()
    assert engine.image(ctx.image_ref) is None
    assert engine.images_with_label(labels.INPUTS_DIGEST, ctx.inputs_digest) == []


@pytest.mark.parametrize("wheelhouse", [True, False])
def test_base_python_other_than_python_version_fails_at_the_first_step_and_says_what_to_run(
    engine: Engine,
    pinned_base: str,
    repos: BuildRepos,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
    wheelhouse: bool,
) -> None:
    # a release host's mistake: [image] python_version (and the wheelhouse, when there is one) say
    # 3.10, the base has another python; pure wheels only, so render cannot tell: the build's first
    # step can, with or without a wheelhouse (without one, pip would fail later, less plainly)
    wheels = fake_wheelhouse(tmp_path / "wheels-py3.10") if wheelhouse else tmp_path / "no-wheelhouse"
    offline = "1" if wheelhouse else "0"  # without a wheelhouse pip would reach for the index
    s = settings(
        pinned_base, docker_cleanup.case_id, tmp_path, python_version="3.10", wheels_dir=str(wheels),
        offline_build=offline,
    )  # fmt: skip
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base))
    with pytest.raises(BuildError) as e:
        build(engine, ctx.dir, s, tmp_path / "run", docker_cleanup)
    text = str(e.value)
    assert f"the base image's python is {TEST_BASE_PYTHON}, but [image] python_version is 3.10" in text
    assert "scripts/setup.sh image-wheelhouse" in text and "[base 2/" in text
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
        build_image(engine, ctx.dir, tag=None, log=log, run_dir=tmp_path / "run", settings=s, env=os.environ)
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
    series = write_series(repos, tmp_path / "patches")
    patch = series / repos.patch_name  # the lock records the series' file (render verifies it)
    pin = PatchPin(name=patch.name, sha256=hashlib.sha256(patch.read_bytes()).hexdigest(), status="applied")
    lock_for(repos, pinned_base).with_patches((pin,)).save(lock_path)
    argv = [
        *("render", "--model", MODEL, "-o", str(tmp_path / "ctx"), "--json"),
        *("--atom-repo", str(repos.atom), "--aiter-repo", str(repos.aiter)),
        *("--patches-dir", str(series)),
        *("--submodule-repo", f"{CK_PATH}={repos.ck}"),
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
    built = build(engine, ctx.dir, s, tmp_path, docker_cleanup, log)
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


# --------------------------------------------------------------------------- the image self-check

SITE = "/usr/local/lib/python3.11/dist-packages"  # the test base image's site-packages (Debian)
PYPI_AITER = f"{SITE}/amd_aiter-0.1.5.dist-info"  # as if a dependency had pulled amd-aiter from PyPI
SHADOW = (
    f"mkdir -p {SITE}/aiter {PYPI_AITER} && touch {SITE}/aiter/__init__.py && "
    f"printf 'Metadata-Version: 2.1\\nName: amd-aiter\\nVersion: 0.1.5\\n' > {PYPI_AITER}/METADATA"
)


@pytest.mark.parametrize(
    ("case", "atom_cmd", "needle"),
    [
        ("shadow", f"{ATOM_INSTALL_CMD} && {SHADOW}", "2 aiter distributions are installed"),
        (
            "reverted",
            f"{ATOM_INSTALL_CMD} && printf 'API = 1\\n' > atom/models/minimax_m3.py",
            "patched file /app/ATOM/atom/models/minimax_m3.py has sha256",
        ),
        (
            "no-tool",
            f"{ATOM_INSTALL_CMD} && rm /usr/local/bin/lm_eval",
            "the recipe's tool `lm_eval` is not in the image",
        ),
        (
            "no-module",
            f"{ATOM_INSTALL_CMD} && rm -r atom/benchmarks",
            "module `atom.benchmarks.benchmark_serving`",
        ),
    ],
)
def test_selfcheck_failure_fails_the_build_and_tags_nothing(
    engine: Engine,
    pinned_base: str,
    repos: BuildRepos,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
    case: str,
    atom_cmd: str,
    needle: str,
) -> None:
    s = settings(pinned_base, docker_cleanup.case_id, tmp_path, atom_install_cmd=atom_cmd)
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base))
    with pytest.raises(SelfCheckError) as e:
        build(engine, ctx.dir, s, tmp_path / "run", docker_cleanup)
    text = str(e.value)
    assert needle in text and "Nothing was tagged" in text, text
    assert e.value.exit_code == ExitCode.BUILD and e.value.evidence
    report = json.loads((tmp_path / "run" / "selfcheck.json").read_text())
    assert report["ok"] is False and any(needle in f for f in report["failures"])
    assert engine.image(ctx.image_ref) is None
    # the image is gone: its inputs-digest label must not let the next build skip the check
    assert engine.images_with_label(labels.INPUTS_DIGEST, ctx.inputs_digest) == []


def test_selfcheck_compares_the_installed_trees_with_the_pre_build_check(
    engine: Engine, pinned_base: str, repos: BuildRepos, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    # a build step that rewrites an aiter signature: the installed trees no longer match the check
    edit = (
        "sed -i 's/kv_cache_v, index_cache/index_cache/' /app/aiter-test/aiter/ops/fused_qknorm_idxrqknorm.py"
    )
    s = settings(
        pinned_base, docker_cleanup.case_id, tmp_path, atom_install_cmd=f"{ATOM_INSTALL_CMD} && {edit}"
    )
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base))
    with pytest.raises(SelfCheckError) as e:
        build(engine, ctx.dir, s, tmp_path / "run", docker_cleanup)
    text = str(e.value)
    assert "checked Python file(s) differ in the image: aiter/aiter/ops/fused_qknorm_idxrqknorm.py" in text
    assert "differs from the pre-build check" in text


# --------------------------------------------------------------------------- BuildKit features


def test_build_secret_reaches_the_step_and_nothing_else(
    engine: Engine,
    pinned_base: str,
    repos: BuildRepos,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
) -> None:
    token = "tok-" + uuid.uuid4().hex
    cmd = f"sha256sum /run/secrets/ATOM_TEST_TOKEN > /app/secret.sha256 && {AITER_BUILD_CMD}"
    s = settings(
        pinned_base, docker_cleanup.case_id, tmp_path, aiter_build_cmd=cmd, build_secrets="ATOM_TEST_TOKEN"
    )
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base))
    assert token not in (ctx.dir / "Dockerfile").read_text()
    with pytest.raises(BuildError, match="ATOM_TEST_TOKEN"):  # the value must be there to build
        build(engine, ctx.dir, s, tmp_path / "run0", docker_cleanup, env={})
    out = build(
        engine, ctx.dir, s, tmp_path / "run", docker_cleanup, env={**os.environ, "ATOM_TEST_TOKEN": token}
    )
    (digest_line,) = run_python(
        engine, out.image_id, "print(open('/app/secret.sha256').read())", docker_cleanup
    )
    assert digest_line.split()[0] == hashlib.sha256(token.encode()).hexdigest()  # the step read it
    code = "import os; print(os.path.exists('/run/secrets/ATOM_TEST_TOKEN'))"
    assert run_python(engine, out.image_id, code, docker_cleanup) == ["False"]
    history = json.dumps(engine.api.history(out.image_id))
    assert token not in history and token not in json.dumps(engine.api.inspect_image(out.image_id))
    assert token not in (tmp_path / "run" / BUILD_LOG).read_text()
    # the classic builder cannot pass secrets: it refuses rather than use a build argument
    engine.remove_image(out.image_id, force=True)  # else the inputs digest finds it: nothing to build
    classic = s.model_copy(update={"image": s.image.model_copy(update={"builder": "classic"})})
    with pytest.raises(BuildError, match="only BuildKit can pass"):
        build(engine, ctx.dir, classic, tmp_path / "run2", docker_cleanup, env={"ATOM_TEST_TOKEN": token})


def test_classic_builder_fallback_builds_the_same_checked_image(
    engine: Engine, pinned_base: str, repos: BuildRepos, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    s = settings(pinned_base, docker_cleanup.case_id, tmp_path, builder="classic")
    ctx = render(
        repos, s, tmp_path / "ctx", lock_for(repos, pinned_base, atom_ref=f"classic-{docker_cleanup.case_id}")
    )
    out = build(engine, ctx.dir, s, tmp_path / "run", docker_cleanup)
    assert out.builder == "classic" and out.context_bytes is None
    assert "Step 1/" in (tmp_path / "run" / BUILD_LOG).read_text()
    assert json.loads((tmp_path / "run" / "selfcheck.json").read_text())["ok"] is True
    api, path, _, _ = run_python(engine, ctx.image_ref, SHOW_ATOM, docker_cleanup)
    assert api == "split-kv-cache" and path == "/app/ATOM/atom/models/minimax_m3.py"


def test_git_missing_from_the_base_fails_at_once(
    engine: Engine, pinned_base: str, repos: BuildRepos, docker_cleanup: DockerCleanup, tmp_path: Path
) -> None:
    s = settings(pinned_base, docker_cleanup.case_id, tmp_path, require_git="1")
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base))
    with pytest.raises(BuildError) as e:
        build(engine, ctx.dir, s, tmp_path / "run", docker_cleanup)
    assert "git is missing from the base image" in str(e.value) and "[base 3/4]" in str(
        e.value
    )  # after the python guard


@pytest.fixture
def second_engine() -> Iterator[Engine]:
    """A second, empty Docker engine (tests/fixtures/second_engine.py), deleted afterwards."""
    try:
        with second_dockerd() as (eng, _):
            yield eng
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


def test_registry_cache_lets_a_clean_engine_skip_the_aiter_build(
    engine: Engine,
    second_engine: Engine,
    pinned_base: str,
    registry: Registry,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
) -> None:
    repos = make_build_repos(tmp_path / "upstreams", nonce=uuid.uuid4().hex)  # an aiter no engine has built
    case = docker_cleanup.case_id
    cache_repo = registry.repo(f"atom-pipeline-test/cache-{case}")
    s = settings(pinned_base, case, tmp_path, cache_repository=cache_repo)
    ctx = render(repos, s, tmp_path / "ctx", lock_for(repos, pinned_base, atom_ref=f"cache-{case}"))
    first = build(engine, ctx.dir, s, tmp_path / "run-a", docker_cleanup)
    assert first.cache_ref.startswith(f"{cache_repo}:buildcache-") and first.aiter_cached is False
    docker_cleanup.image(first.cache_ref.split("@")[0])
    (stamp_a,) = run_python(
        engine, first.image_id, "print(open('/app/aiter-test/BUILD_STAMP').read())", docker_cleanup
    )

    # engine B has nothing: no image, no build cache, not even the base (it pulls it by digest)
    b = second_engine
    assert b.images_with_label(labels.INPUTS_DIGEST) == [] and b.image(pinned_base) is None
    s_b = s.model_copy(update={"paths": s.paths.model_copy(update={"cache_dir": str(tmp_path / "cache-b")})})
    second = build(b, ctx.dir, s_b, tmp_path / "run-b", docker_cleanup)
    assert second.aiter_cached is True, (tmp_path / "run-b" / BUILD_LOG).read_text()[-3000:]
    log_b = (tmp_path / "run-b" / BUILD_LOG).read_text()
    assert "aiter built in" not in log_b  # the expensive step's own output: it did not run
    with b.run(second.image_id, ["python3", "-c", "print(open('/app/aiter-test/BUILD_STAMP').read())"]) as c:
        assert c.wait(timeout=60) == 0
        assert c.logs().strip() == stamp_a

    # aiter's stage went to the registry cache under its own key, compiled once (alone, before the
    # full build on engine A, which started from it)
    key = read_manifest(ctx.dir).aiter_stage
    log_a = (tmp_path / "run-a" / BUILD_LOG).read_text()
    assert log_a.count("aiter built in") == 1, log_a[-3000:]
    reg = RegistryClient(registry.host)
    assert reg.manifest_digest(f"atom-pipeline-test/cache-{case}", aiter_cache_tag(key)) is not None
    # Another ATOM tree (no patch) with the same aiter pin: another image, the same aiter stage
    # key, and on engine B nothing of aiter is compiled.
    ctx2 = render(
        repos, s, tmp_path / "ctx2", lock_for(repos, pinned_base, patched=False, atom_ref=f"c2-{case}")
    )
    assert ctx2.inputs_digest != ctx.inputs_digest and read_manifest(ctx2.dir).aiter_stage == key
    third = build(b, ctx2.dir, s_b, tmp_path / "run-c", docker_cleanup)
    log_c = (tmp_path / "run-c" / BUILD_LOG).read_text()
    assert third.aiter_cached is True and "aiter built in" not in log_c, log_c[-3000:]
