"""The scheduled rebuild's job scripts (scripts/ci/), run in the workflow's order as its runners would.

- plan: a fresh virtual environment with the production install only (`scripts/setup.sh`'s
  `production`: no test package importable), `scripts/ci/plan.sh` over three models that share
  an aiter pin;
- build: engine A, a second dockerd (tests/fixtures/second_engine.py), with the registry cache:
  the lead build, then the others (`scripts/ci/build.sh DIGEST`);
- smoke: engine B, the local dockerd behind the real sshd (`ssh://`), each model's candidate
  pulled by digest; the GPU boundary faked as the smoke tests fake it (a KFD topology);
- tag: a third environment (nothing of the others' variables, the local engine's socket).

Each model's recipe names the model, so no two of them share an inputs digest (the image
carries its recipe): the plan has one build per model, and what they share is aiter's stage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.oci.engine import Engine
from pipeline.oci.registry import RegistryClient
from tests.docker.conftest import DockerCleanup
from tests.docker.test_e2e import MODEL, World, world  # noqa: F401  (the fixture)
from tests.fixtures.build_repos import TEST_BASE_PYTHON, test_wheelhouse
from tests.fixtures.second_engine import second_dockerd
from tests.servers.sshd import Sshd, start_sshd

REPO = Path(__file__).resolve().parents[2]
MODELS = (MODEL, f"{MODEL}-B", f"{MODEL}-C")
WHEELS = test_wheelhouse()  # read before a fixture points PIPELINE_CACHE_DIR elsewhere


@pytest.fixture
def engine_a() -> Iterator[tuple[Engine, str]]:
    try:
        with second_dockerd() as found:
            yield found
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    try:
        with start_sshd(tmp_path / "sshd") as server:
            yield server
    except FileNotFoundError as err:
        pytest.fail(str(err), pytrace=False)


def _job(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "ci" / script), *args],
        env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"{script} {args}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def test_the_workflows_jobs_in_order_compile_aiter_once_and_carry_one_digest_to_the_tag(
    world: World,  # noqa: F811
    engine: Engine,
    engine_a: tuple[Engine, str],
    sshd: Sshd,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
) -> None:
    recipes = world.root / "recipes"
    text = (recipes / f"{MODEL}.yaml").read_text().replace("limit: 60", "limit: 8")
    # What this test follows is the image from job to job: no serving benchmark (its latency
    # gate is a timing on a shared machine), and B and C serve the chat check alone (lm_eval's
    # start-up is most of a smoke here)
    text = text[: text.index("  - kind: serving-benchmark")]
    start = text.index("  - kind: gsm8k")
    lighter = text[:start]
    for name in MODELS:  # three models, one aiter pin
        body = text if name == MODEL else lighter
        (recipes / f"{name}.yaml").write_text(body.replace(f"name: {MODEL}\n", f"name: {name}\n"))
    dirs = {
        k: str(tmp_path / v)
        for k, v in (("PLAN_DIR", "plan"), ("CANDIDATES_DIR", "cand"), ("VERDICTS_DIR", "ver"))
    }
    venv = tmp_path / "venv"
    base = {
        "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHON": sys.executable,
        "VENV": str(venv), **dirs,
    }  # fmt: skip
    pipeline_env = {
        **world.env,
        "PIPELINE_WHEELS_DIR": str(WHEELS),
        "PIPELINE_PYTHON_VERSION": TEST_BASE_PYTHON,
        "PIPELINE_OFFLINE_BUILD": "1",
        "PIPELINE_REQUIRE_GIT": "0",
    }

    # plan, on a runner with nothing but the production install
    outputs = tmp_path / "github_output"
    _job(
        "plan.sh",
        env={**base, **pipeline_env, "GITHUB_OUTPUT": str(outputs), "REQUESTED_MODELS": json.dumps(MODELS)},
    )
    for module in ("pytest", "ruff", "mypy", "matplotlib", "tests"):
        probe = subprocess.run(
            [str(venv / "bin" / "python"), "-c", f"import {module}"], capture_output=True, check=False
        )
        assert probe.returncode != 0, f"{module} is importable in the production install"
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import pipeline; print(pipeline.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, check=True,
    ).stdout  # fmt: skip
    assert str(venv) in where  # the installed copy, not the checkout
    matrix = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    lead, follow, smoke = (json.loads(matrix[k]) for k in ("lead", "follow", "smoke"))
    assert (len(lead), len(follow), sorted(smoke), json.loads(matrix["left_out"])) == (
        1,
        2,
        sorted(MODELS),
        [],
    )

    # build on engine A, the lead first (it compiles aiter's stage), then the others from its cache
    _, host_a = engine_a
    build_env = {
        **base,
        **pipeline_env,
        "DOCKER_HOST": host_a,
        "PIPELINE_CACHE_REPOSITORY": world.registry.repo(
            f"atom-pipeline-test/cache-{docker_cleanup.case_id}"
        ),
        "PIPELINE_CACHE_DIR": str(tmp_path / "build-host-cache"),
        "PIPELINE_RUNS_DIR": str(tmp_path / "build-host-runs"),
    }
    for digest in lead + follow:
        _job("build.sh", digest, env=build_env)
    candidates = [json.loads(p.read_text()) for p in sorted((tmp_path / "cand").glob("*/candidate.json"))]
    assert sorted(c["inputs_digest"] for c in candidates) == sorted(lead + follow)  # one build per digest
    assert len({c["aiter_stage"] for c in candidates}) == 1
    compiles = sum((Path(c["run_dir"]) / "build.log").read_text().count("aiter built in") for c in candidates)
    assert compiles == 1  # aiter's stage ran once for the three models
    assert [c["aiter_cached"] for c in candidates if c["inputs_digest"] in follow] == [True, True]
    by_model = {m: c for c in candidates for m in c["models"]}
    # the lead's job run again (a re-run of the workflow): the image is on engine A, nothing is
    # built, and the same registry digest is handed on
    _job("build.sh", lead[0], env={**build_env, "CANDIDATES_DIR": str(tmp_path / "again")})
    (again,) = [json.loads(p.read_text()) for p in (tmp_path / "again").glob("*/candidate.json")]
    first = next(c for c in candidates if c["inputs_digest"] == lead[0])
    assert again["skipped"] is True and again["found_in"] == "local"
    assert again["candidate"] == first["candidate"]

    # smoke on engine B through ssh://, each candidate pulled by its registry digest
    smoke_env = {**base, **pipeline_env, "DOCKER_HOST": sshd.docker_host, "PATH": sshd.env_path}
    try:
        for model in smoke:
            _job("smoke.sh", model, env=smoke_env)
    finally:
        for c in candidates:
            tagged, digest = c["candidate"].rsplit("@", 1)  # repository:tag@sha256:...
            docker_cleanup.image(f"{tagged.rsplit(':', 1)[0]}@{digest}")
    for model in MODELS:
        verdict = json.loads((tmp_path / "ver" / model / "verdict.json").read_text())
        assert verdict["passed"] is True, verdict
        assert verdict["image"]["digest"] == by_model[model]["candidate"].rsplit("@", 1)[1]

    # tag in a third environment: the plan, the candidates and the verdicts, nothing else
    tag_env = {
        **base,
        **{k: world.env[k] for k in ("PIPELINE_REGISTRY", "PIPELINE_REPOSITORY", "PIPELINE_RECIPES_DIR")},
        "PIPELINE_LOCKS_DIR": str(tmp_path / "tag-locks"),
        "PIPELINE_RUNS_DIR": str(tmp_path / "tag-runs"),
        "PIPELINE_CACHE_DIR": str(tmp_path / "tag-cache"),
    }
    try:
        _job("tag.sh", env=tag_env)
    finally:
        for model in MODELS:
            for info in engine.images_with_label("org.atom-image-pipeline.model", model):
                for ref in (*info.tags, *info.digests):
                    docker_cleanup.image(ref)
    client = RegistryClient(world.registry.host)
    for model in MODELS:
        record = json.loads((tmp_path / "ver" / model / "record.json").read_text())
        pushed = "sha256:" + record["subject"][0]["digest"]["sha256"]
        built = by_model[model]["candidate"].rsplit("@", 1)[1]
        assert pushed == built  # the digest built on engine A is the one smoked on B and tagged here
        assert client.manifest_digest(world.repository, f"{model}-verified") == built
