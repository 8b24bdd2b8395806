"""The scheduled rebuild's job scripts (scripts/ci/), run in the workflow's order as its runners would.

- plan: a fresh virtual environment with the production install only (`scripts/setup.sh`'s
  `production`: no test package importable), `scripts/ci/plan.sh`;
- build: engine A, a second dockerd (tests/fixtures/second_engine.py), with the registry cache
  (`scripts/ci/build.sh DIGEST`, one job per distinct inputs digest);
- smoke: engine B, the local dockerd behind the real sshd (`ssh://`), each model's candidate
  pulled by digest; the GPU boundary faked as the smoke tests fake it (a KFD topology);
- tag: a third environment (nothing of the others' variables, the local engine's socket).

Three models, one aiter pin. The image is model-free (its identity is the lock's pair digest,
settings, templates, wheels), so every model of one plan shares one image: the first nightly
plans A and B, whose locks differ only by the model, and builds ONE image for both. Then ATOM
moves upstream and the next nightly plans C: another ATOM commit, another image, the same aiter
pin, so aiter's stage comes from the registry cache. aiter is compiled once for the three.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline import labels
from pipeline.oci.engine import Engine
from pipeline.oci.registry import RegistryClient
from tests.docker.conftest import DockerCleanup
from tests.docker.test_e2e import MODEL, World, world  # noqa: F401  (the fixture)
from tests.fixtures.build_repos import TEST_BASE_PYTHON, run_git, test_wheelhouse
from tests.servers.sshd import Sshd

REPO = Path(__file__).resolve().parents[2]
MODELS = (MODEL, f"{MODEL}-B", f"{MODEL}-C")
WHEELS = test_wheelhouse()  # read before a fixture points PIPELINE_CACHE_DIR elsewhere


def _job(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "ci" / script), *args],
        env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, (
        f"{script} {args}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


def _nightly(
    tag: str, models: tuple[str, ...], tmp_path: Path, base: dict[str, str], pipeline_env: dict[str, str]
) -> tuple[dict[str, str], list[str], list[str]]:
    """The plan job of one nightly: its directories, and the plan's builds (lead, follow)."""
    dirs = {
        k: str(tmp_path / f"{v}{tag}")
        for k, v in (("PLAN_DIR", "plan"), ("CANDIDATES_DIR", "cand"), ("VERDICTS_DIR", "ver"))
    }
    outputs = tmp_path / f"github_output{tag}"
    _job(
        "plan.sh",
        env={
            **base, **pipeline_env, **dirs,
            "GITHUB_OUTPUT": str(outputs), "REQUESTED_MODELS": json.dumps(models),
        },
    )  # fmt: skip
    matrix = dict(line.split("=", 1) for line in outputs.read_text().splitlines())
    lead, follow, smoke = (json.loads(matrix[k]) for k in ("lead", "follow", "smoke"))
    assert (sorted(smoke), json.loads(matrix["left_out"])) == (sorted(models), [])
    return dirs, lead, follow


def test_the_workflows_jobs_in_order_share_one_image_per_pair_compile_aiter_once_and_carry_one_digest(
    world: World,  # noqa: F811
    engine: Engine,
    second_engine: tuple[Engine, str],
    sshd_host: Sshd,
    docker_cleanup: DockerCleanup,
    tmp_path: Path,
) -> None:
    a, b, c = MODELS
    recipes = world.root / "recipes"
    text = (recipes / f"{MODEL}.yaml").read_text().replace("limit: 60", "limit: 8")
    # What this test follows is the image from job to job: no serving benchmark (its latency
    # gate is a timing on a shared machine), and B and C serve the chat check alone (lm_eval's
    # start-up is most of a smoke here)
    text = text[: text.index("  - kind: serving-benchmark")]
    lighter = text[: text.index("  - kind: gsm8k")]
    for name in MODELS:  # three models, one aiter pin
        body = text if name == MODEL else lighter
        (recipes / f"{name}.yaml").write_text(body.replace(f"name: {MODEL}\n", f"name: {name}\n"))
    venv = tmp_path / "venv"
    base = {
        "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHON": sys.executable,
        "VENV": str(venv),
    }  # fmt: skip
    pipeline_env = {
        **world.env,
        "PIPELINE_WHEELS_DIR": str(WHEELS),
        "PIPELINE_PYTHON_VERSION": TEST_BASE_PYTHON,
        "PIPELINE_OFFLINE_BUILD": "1",
        "PIPELINE_REQUIRE_GIT": "0",
    }
    _, host_a = second_engine
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
    smoke_env = {**base, **pipeline_env, "DOCKER_HOST": sshd_host.docker_host, "PATH": sshd_host.env_path}
    tag_env = {
        **base,
        **{k: world.env[k] for k in ("PIPELINE_REGISTRY", "PIPELINE_REPOSITORY", "PIPELINE_RECIPES_DIR")},
        "PIPELINE_LOCKS_DIR": str(tmp_path / "tag-locks"),
        "PIPELINE_RUNS_DIR": str(tmp_path / "tag-runs"),
        "PIPELINE_CACHE_DIR": str(tmp_path / "tag-cache"),
    }

    def cleanup() -> None:
        for info in engine.images_with_label(labels.PAIR_DIGEST):
            refs = (*info.tags, *info.digests)
            if any(world.repository in ref for ref in refs):
                for ref in refs:
                    docker_cleanup.image(ref)

    candidates: list[dict[str, Any]] = []
    verdicts: dict[str, Path] = {}
    try:
        for tag, models in (("1", (a, b)), ("2", (c,))):
            if tag == "2":  # ATOM moves upstream (a commit the series still applies to): a new image
                (world.repos.atom / "NIGHTLY.md").write_text("the second nightly's ATOM\n")
                run_git(world.repos.atom, "add", "-A")
                run_git(world.repos.atom, "commit", "-q", "-m", "docs: nightly", date="2026-06-25T10:00:00Z")
            # plan, on a runner with nothing but the production install
            dirs, lead, follow = _nightly(tag, models, tmp_path, base, pipeline_env)
            # ONE build for the models of one pair (their locks differ only by the model)
            assert (len(lead), follow) == (1, [])
            plan = json.loads((Path(dirs["PLAN_DIR"]) / "plan.json").read_text())
            assert [bld["models"] for bld in plan["builds"]] == [sorted(models)]
            # build on engine A
            _job("build.sh", lead[0], env={**build_env, **dirs})
            (built,) = [
                json.loads(p.read_text()) for p in Path(dirs["CANDIDATES_DIR"]).glob("*/candidate.json")
            ]
            assert built["inputs_digest"] == lead[0] and built["models"] == sorted(models)
            candidates.append(built)
            if tag == "1":
                # the job run again (a re-run of the workflow): the image is on engine A, nothing
                # is built, the same registry digest is handed on
                again_dir = {**dirs, "CANDIDATES_DIR": str(tmp_path / "again")}
                _job("build.sh", lead[0], env={**build_env, **again_dir})
                (again,) = [json.loads(p.read_text()) for p in (tmp_path / "again").glob("*/candidate.json")]
                assert again["skipped"] is True and again["found_in"] == "local"
                assert again["candidate"] == built["candidate"]
            # smoke on engine B through ssh://, the candidate pulled by its registry digest
            for model in models:
                _job("smoke.sh", model, env={**smoke_env, **dirs})
                verdicts[model] = Path(dirs["VERDICTS_DIR"]) / model
            # tag in a third environment: the plan, the candidates and the verdicts, nothing else
            _job("tag.sh", env={**tag_env, **dirs})
    finally:
        for cand in candidates:
            tagged, digest = cand["candidate"].rsplit("@", 1)  # repository:tag@sha256:...
            docker_cleanup.image(f"{tagged.rsplit(':', 1)[0]}@{digest}")
        cleanup()

    # the production install held nothing of the test machinery
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

    # two images (A and B share one; C's ATOM differs), one aiter pin: aiter compiled once
    first, second = candidates
    assert first["inputs_digest"] != second["inputs_digest"]
    assert first["candidate"].rsplit("@", 1)[1] != second["candidate"].rsplit("@", 1)[1]
    assert first["aiter_stage"] == second["aiter_stage"]
    compiles = sum(
        (Path(cd["run_dir"]) / "build.log").read_text().count("aiter built in") for cd in candidates
    )
    assert compiles == 1  # the simulated aiter step ran once for the three models
    assert second["aiter_cached"] is True
    by_model = {m: cd for cd in candidates for m in cd["models"]}
    client = RegistryClient(world.registry.host)
    for model in MODELS:
        built = by_model[model]["candidate"].rsplit("@", 1)[1]
        verdict = json.loads((verdicts[model] / "verdict.json").read_text())
        assert verdict["passed"] is True, verdict
        assert verdict["image"]["digest"] == built  # built on engine A, smoked on B by that digest
        record = json.loads((verdicts[model] / "record.json").read_text())
        assert "sha256:" + record["subject"][0]["digest"]["sha256"] == built  # and tagged here
        assert client.manifest_digest(world.repository, f"{model}-verified") == built
        # model -> lock -> image: the verdict binds the model's own lock, whose pair the image has
        assert (
            verdict["recipe"]["name"] == model
            and verdict["lock_sha256"] == record["predicate"]["lock"]["sha256"]
        )
        assert verdict["pair_digest"] == record["predicate"]["lock"]["pair_digest"]
    assert by_model[a] is by_model[b]  # one image, two models: each has its own tag on it
