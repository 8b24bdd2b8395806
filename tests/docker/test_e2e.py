"""`pipeline build --model` end to end, then `pipeline rebuild`, on a real engine and registry.

The fixture upstreams (tests/fixtures/build_repos.py) have the shape of the real bug: aiter
split `kv_cache` into `kv_cache_k`/`kv_cache_v`, ATOM still calls the old signature, and
our patch series fixes the call. Here ATOM also ships the server: the docker tier's
OpenAI-compatible stand-in (tests/servers/openai_server.py), the stand-in for benchmark_serving
and a generated GSM8K-format task (tests/servers/gsm8k_local.py) for the real lm_eval the image
bakes in, so the image the pipeline builds is the image the smoke stage serves and scores.
Its warm-up imports the patched ATOM model and calls aiter: an unpatched tree would die
there with a TypeError, as the real server died on MI355.

No GPU anywhere: the recipe's GPU preflight reads a fake KFD topology (tests/fixtures/sysfs.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline import labels
from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.oci.engine import Engine
from pipeline.oci.registry import RegistryClient
from tests.docker.conftest import DockerCleanup, Registry
from tests.fixtures.build_repos import (
    AITER_BUILD_CMD,
    ATOM_INSTALL_CMD,
    BuildRepos,
    make_build_repos,
    run_git,
    write_series,
)
from tests.fixtures.sysfs import make_sysfs, nodes_dir

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / "tests" / "servers"
MODEL = "E2E-Tiny"
TOOLS = "/app/ATOM/atom/entrypoints"
WARMUP = "import atom.models.minimax_m3 as m; print('warm-up:', m.forward('q', 'k', ('kc', 'vc'), None))"


@dataclass
class World:
    repos: BuildRepos
    root: Path
    registry: Registry
    repository: str
    env: dict[str, str]


def e2e_recipe(dest: Path) -> Path:
    """The docker tier's test recipe, serving from the ATOM tree the pipeline built."""
    text = (SERVERS / "recipe-test.yaml").read_text()
    replacements = {
        "name: Smoke-Test-Tiny": f"name: {MODEL}",
        'command: [python3, /opt/smoke/openai_server.py, --model, "${model}", --port, "${port}"]': (
            f'command: [sh, -c, "python3 -c \\"{WARMUP}\\" && exec python3 {TOOLS}/openai_server.py '
            f'--model ${{model}} --port ${{port}}"]'
        ),
        # the real lm_eval the image bakes in, on the generated GSM8K-format task, written in the
        # container by the check's setup step (it includes the image's own lm_eval gsm8k config)
        "    task: gsm8k\n": (
            f"    setup: [python3, {TOOLS}/gsm8k_local.py, {TOOLS}/lm_eval_tasks]\n    task: gsm8k\n"
        ),
        "/opt/smoke/": f"{TOOLS}/",
    }
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{MODEL}.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def world(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    engine: Engine,
    base_image: str,
    registry: Registry,
    docker_cleanup: DockerCleanup,
) -> World:
    repos = make_build_repos(tmp_path / "upstreams", nonce=uuid.uuid4().hex)
    entry = repos.atom / "atom" / "entrypoints"
    entry.mkdir(parents=True)
    (entry / "__init__.py").write_text("")
    for name in ("openai_server.py", "gsm8k_local.py", "standin_benchmark_serving.py"):
        shutil.copy(SERVERS / name, entry / name)
    run_git(repos.atom, "add", "-A")
    run_git(repos.atom, "commit", "-q", "-m", "OpenAI server", date="2026-06-24T10:00:00Z")
    write_series(repos, tmp_path / "patches")
    e2e_recipe(tmp_path / "recipes")

    # the base image, pinned by the digest the test registry gives it
    base_repo = registry.repo("atom-pipeline-test/e2e-base")
    engine.tag(base_image, base_repo, "1")
    docker_cleanup.image(f"{base_repo}:1")
    docker_cleanup.image(f"{base_repo}@{engine.push(base_repo, '1')}")

    hf = tmp_path / "hf"
    (hf / "hub" / "models--smoke-test--tiny-chat" / "snapshots" / "0123abcd").mkdir(parents=True)
    sysfs = make_sysfs(tmp_path / "sysfs")
    repository = f"atom-pipeline-test/e2e-{docker_cleanup.case_id}"
    env = {
        "PIPELINE_ATOM_REPO": str(repos.atom),
        "PIPELINE_AITER_REPO": str(repos.aiter),
        "PIPELINE_CACHE_DIR": str(tmp_path / "cache"),
        "PIPELINE_RUNS_DIR": str(tmp_path / "runs"),
        "PIPELINE_LOCKS_DIR": str(tmp_path / "locks"),
        "PIPELINE_RECIPES_DIR": str(tmp_path / "recipes"),
        "PIPELINE_PATCHES_DIR": str(tmp_path / "patches"),
        "PIPELINE_TEMPLATES_DIR": str(REPO / "dockerfiles"),
        "PIPELINE_BASE_IMAGE": f"{base_repo}:1",
        "PIPELINE_AITER_BUILD_CMD": AITER_BUILD_CMD,
        "PIPELINE_ATOM_INSTALL_CMD": ATOM_INSTALL_CMD,
        "PIPELINE_REPOSITORY": repository,
        "PIPELINE_REGISTRY": registry.host,
        "PIPELINE_HF_CACHE": str(hf),
        "PIPELINE_KFD_TOPOLOGY": str(nodes_dir(sysfs)),
        "PIPELINE_FETCH_RETRIES": "0",
        "HF_TOKEN": "hf_" + uuid.uuid4().hex,  # made up per run: must never be written anywhere
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    return World(repos, tmp_path, registry, repository, env)


def runs(world: World) -> list[Path]:
    return sorted((world.root / "runs").iterdir())


def stage_status(run: Path) -> dict[str, str]:
    return {p.stem: json.loads(p.read_text())["status"] for p in (run / "stages").glob("*.json")}


def cleanup_built(engine: Engine, cleanup: DockerCleanup, world: World) -> None:
    for info in engine.images_with_label(labels.PAIR_DIGEST):  # the image names no model
        refs = (*info.tags, *info.digests)
        if any(world.repository in ref for ref in refs):
            for ref in refs:
                cleanup.image(ref)


def test_build_to_verified_tag_then_rebuild_falls_back_on_a_breaking_aiter(
    world: World, engine: Engine, docker_cleanup: DockerCleanup, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["build", "--model", MODEL])
    finally:
        cleanup_built(engine, docker_cleanup, world)
    err = capsys.readouterr().err
    assert code == 0, err
    (run,) = runs(world)
    assert stage_status(run) == dict.fromkeys(
        ("pin", "check", "patch", "render", "build", "smoke", "tag"), "ok"
    )
    verdict = json.loads((run / "smoke" / "verdict.json").read_text())
    assert verdict["passed"] is True and verdict["status"] == "passed"
    tag = json.loads((run / "stages" / "tag.json").read_text())["outputs"]
    image = json.loads((run / "stages" / "build.json").read_text())["outputs"]["image"]
    assert verdict["image"]["id"] == image
    # the GSM8K gate read the results file of the real lm_eval in the built image, and the
    # running score from the recording proxy ended where lm_eval did
    gsm = next(c for c in verdict["checks"] if c["name"] == "gsm8k")
    assert gsm["status"] == "passed" and gsm["figures"]["samples"] == 60
    assert gsm["figures"]["value"] == 1.0 == gsm["figures"]["running_value"]
    assert gsm["figures"]["running_scored"] == 60

    # the registry has the immutable tag and the moving tag, on the same digest
    client = RegistryClient(world.registry.host)
    assert client.manifest_digest(world.repository, tag["ref"].rsplit(":", 1)[1]) == tag["digest"]
    assert client.manifest_digest(world.repository, f"{MODEL}-verified") == tag["digest"]
    record = json.loads((run / "smoke" / "record.json").read_text())
    assert record["subject"][0]["digest"]["sha256"] == tag["digest"].removeprefix("sha256:")
    # no SLSA/SBOM from this front end, said in the record; our build provenance of this image linked
    att = record["predicate"]["attestations"]
    assert att["slsa_provenance"] is None and att["sbom"] is None and att["note"].startswith("not produced")
    prov = json.loads(Path(att["build_provenance"]["path"]).read_text())
    assert prov["subject"][0]["digest"]["sha256"] == image.removeprefix("sha256:")
    assert prov["predicate"]["slsa"]["level"] is None and prov["predicate"]["inputs_digest"]
    # the image serves the patched ATOM: the warm-up line is in the server log
    assert "warm-up: new-api" in "".join(p.read_text() for p in (run / "smoke").rglob("*.log"))
    # the released state the next rebuild compares with
    released = json.loads((world.root / "locks" / f"{MODEL}.released.json").read_text())
    assert released["digest"] == tag["digest"]
    # no secret in anything the run wrote
    for f in run.rglob("*"):
        if f.is_file():
            assert world.env["HF_TOKEN"].encode() not in f.read_bytes(), f

    # upstream aiter inserts a parameter: the patched call now shifts; rebuild falls back
    op = world.repos.aiter / "aiter" / "ops" / "fused_qknorm_idxrqknorm.py"
    op.write_text(
        "def fused_qknorm_idxrqknorm(\n"
        "    q, k, kv_cache_k, kv_cache_v, index_cache, kv_scale, block_size, q_out\n"
        "):\n"
        '    return "newer-api"\n'
    )
    run_git(world.repos.aiter, "commit", "-q", "-am", "add kv_scale", date="2026-07-01T12:00:00Z")
    breaking = run_git(world.repos.aiter, "rev-parse", "HEAD")
    try:
        code = main(["rebuild", "--model", MODEL, "--json"])
    finally:
        cleanup_built(engine, docker_cleanup, world)
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, captured.err
    (outcome,) = json.loads(out[out.index("[") :])
    # the fallback pin is exactly what was released: nothing to build, and the break is named
    assert outcome["status"] == "unchanged", outcome
    assert outcome["aiter"] == world.repos.aiter_sha
    notes = " ".join(outcome["notes"])
    assert breaking[:10] in notes and "fell back" in notes and "already released" in notes


def test_killed_build_resumes_at_the_build_stage(
    world: World, engine: Engine, docker_cleanup: DockerCleanup
) -> None:
    env = {**os.environ, **world.env, "PIPELINE_AITER_BUILD_CMD": f"sleep 8 && {AITER_BUILD_CMD}"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "build", "--model", MODEL, "--until", "build"],
        cwd=world.root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        run: Path | None = None
        while time.monotonic() < deadline:
            found = runs(world) if (world.root / "runs").is_dir() else []
            if found and (found[0] / "stages" / "render.json").is_file():
                run = found[0]
                if "=== stage build" in (run / "pipeline.log").read_text():
                    time.sleep(3)  # inside the aiter step's `sleep 8`
                    break
            time.sleep(0.2)
        assert run is not None, "the build never started"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert stage_status(run) == dict.fromkeys(("pin", "check", "patch", "render"), "ok")

    try:
        code = subprocess.run(
            [sys.executable, "-m", "pipeline", "build", "--resume", str(run), "--until", "build"],
            cwd=world.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        cleanup_built(engine, docker_cleanup, world)
    assert code.returncode == 0, code.stderr
    for stage in ("pin", "check", "patch", "render"):
        assert f"↷ {stage}" in code.stderr, code.stderr
    assert "✓ build" in code.stderr
    assert stage_status(run)["build"] == "ok"


def test_without_gpus_the_run_stops_after_build_with_its_own_code(
    world: World, engine: Engine, docker_cleanup: DockerCleanup, capsys: pytest.CaptureFixture[str]
) -> None:
    os.environ["PIPELINE_KFD_TOPOLOGY"] = str(world.root / "no-such-kfd")
    try:
        code = main(["build", "--model", MODEL])
    finally:
        cleanup_built(engine, docker_cleanup, world)
    err = capsys.readouterr().err
    assert code == ExitCode.NO_HARDWARE, err
    (run,) = runs(world)
    states = stage_status(run)
    assert states["build"] == "ok" and states["smoke"] == "stopped" and "tag" not in states
    assert "pipeline smoke --image" in err and "--docker-host ssh://" in err
    client = RegistryClient(world.registry.host)
    assert client.manifest_digest(world.repository, f"{MODEL}-verified") is None
