"""`pipeline smoke` against a real Docker engine.

There is no GPU here and nothing can be pulled, so the test image is built FROM the local
base image (bookworm + python3) with tests/servers/ copied in:

- the server is tests/servers/openai_server.py (an OpenAI-compatible stand-in for ATOM's
  server, with failure modes), run with the recipe's container options;
- `lm_eval` is the real one (the pinned lm-eval, `smoke_image` in conftest.py), running the
  real gsm8k task config over a generated local GSM8K-format data set;
- ATOM's `benchmark_serving` needs the ATOM tree and a tokenizer, so the image carries a
  stand-in (tests/servers/standin_benchmark_serving.py) that writes the *real* tool's
  --save-result JSON (its shape is checked against ATOM's script: tests/git/test_benchfmt.py);
- the GPU preflight reads a fake KFD topology (tests/fixtures/sysfs.py); the test recipe
  needs no device nodes.

Everything else -- preflight, container start, log streaming, fail fast, the in-container
probes, reading and gating the result files, the verdict and reports, cleanup -- is the code
path that runs on an MI355 host.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.config import Settings, load_settings
from pipeline.dockerw import Engine
from pipeline.errors import ExitCode, NoHardware
from pipeline.fsutil import sha256_file
from pipeline.log import Logger
from pipeline.recipe import load_recipe
from pipeline.smoke import SmokeOptions, Verdict, load_verdict, run_smoke
from pipeline.smoke.preflight import run_preflight
from tests.docker.conftest import (
    CASE_LABEL,
    INPUTS_LABEL_VALUE,
    LOCK_LABEL_VALUE,
    SESSION_ID,
    TEST_LABEL,
    DockerCleanup,
)
from tests.fixtures.sysfs import make_sysfs, nodes_dir

REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / "tests" / "servers"
TEST_RECIPE = SERVERS / "recipe-test.yaml"
SEED_LINE = (
    "RuntimeError: aiter::_fused_qknorm_idxrqknorm_hip() Expected a value of type 'Optional[Tensor]' "
    "for argument 'index_cache' but instead found type 'int'."
)


def variant(tmp_path: Path, mode: str = "healthy", *, replace: dict[str, str] | None = None) -> Path:
    """The test recipe with another SMOKE_TEST_MODE (and other textual replacements)."""
    text = TEST_RECIPE.read_text()
    text = text.replace("SMOKE_TEST_MODE: healthy", f"SMOKE_TEST_MODE: {mode}")
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"recipe-{mode}.yaml"
    path.write_text(text)
    return path


def hf_cache_with_model(root: Path) -> Path:
    snap = root / "hub" / "models--smoke-test--tiny-chat" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    return root


def settings_for(tmp_path: Path, hf_cache: Path) -> Settings:
    return load_settings(
        env={"PIPELINE_HF_CACHE": str(hf_cache), "PIPELINE_RUNS_DIR": str(tmp_path / "runs")}, cwd=tmp_path
    )


def smoke(
    engine: Engine,
    image: str,
    recipe_path: Path,
    tmp_path: Path,
    cleanup: DockerCleanup,
    *,
    env: dict[str, str] | None = None,
    hf_cache: Path | None = None,
    run_all: bool = False,
    sysfs: Path | None = None,
) -> tuple[Verdict, Path, float]:
    run_dir = tmp_path / "run"
    log = Logger(stream=io.StringIO())
    log.attach(run_dir)
    cache = hf_cache if hf_cache is not None else hf_cache_with_model(tmp_path / "hf")
    start = time.monotonic()
    try:
        verdict = run_smoke(
            engine,
            image=image,
            recipe=load_recipe(recipe_path),
            recipe_path=recipe_path,
            settings=settings_for(tmp_path, cache),
            env=env or {},
            run_dir=run_dir,
            log=log,
            run_all=run_all,
            sysfs_root=sysfs if sysfs is not None else make_sysfs(tmp_path / "sys"),
            options=SmokeOptions(labels=cleanup.labels),
        )
    finally:
        log.close()
    return verdict, run_dir, time.monotonic() - start


def no_container_left(engine: Engine, cleanup: DockerCleanup) -> None:
    assert engine.containers_with_label(CASE_LABEL, cleanup.case_id) == []


def test_healthy_server_passes_every_gate(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe = variant(tmp_path)
    verdict, run_dir, _ = smoke(engine, smoke_image, recipe, tmp_path, docker_cleanup)

    assert verdict.status == "passed" and verdict.passed, verdict.reason
    assert [c.name for c in verdict.checks] == ["server-ready", "chat", "gsm8k", "serving-benchmark[c4]"]
    assert all(c.status == "passed" for c in verdict.checks)
    gsm = verdict.checks[2]
    assert gsm.figures["value"] == 1.0 and gsm.figures["samples"] == 60  # the recipe's limit: 60
    assert gsm.limits["min_value"] < 0.9363
    bench = verdict.checks[3]
    assert bench.figures["completed"] == 20 and bench.figures["output_throughput"] > 150
    # bound to the image and recipe
    info = engine.image(smoke_image)
    assert info is not None and verdict.image.id == info.id
    assert verdict.lock_sha256 == LOCK_LABEL_VALUE and verdict.inputs_digest == INPUTS_LABEL_VALUE
    assert verdict.recipe.sha256 == sha256_file(recipe)
    # the files: verdict (loadable by the tag stage), summary, junit, the tools' own outputs
    assert load_verdict(run_dir / "verdict.json") == verdict
    assert "PASSED" in (run_dir / "summary.md").read_text()
    suite = ET.parse(run_dir / "junit.xml").getroot()
    assert suite.get("tests") == "4" and suite.get("failures") == "0"
    results = json.loads((run_dir / "gsm8k-results.json").read_text())
    assert results["results"]["gsm8k"]["exact_match,flexible-extract"] == 1.0
    assert "output_throughput" in json.loads((run_dir / "serving-benchmark-c4.json").read_text())
    assert "Starting server" in (run_dir / "server.log").read_text()
    # the plot (the `plot` extra): our row, passed, and the link from summary.md
    svg = (run_dir / "benchmark.svg").read_text()
    assert 'id="row-c4-passed-output_throughput"' in svg and "failed rows" not in svg
    assert "[benchmark.svg](benchmark.svg)" in (run_dir / "summary.md").read_text()
    no_container_left(engine, docker_cleanup)


def test_crash_at_warmup_fails_fast_with_the_exception_line(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Through the CLI: exit 8 and the seed's RuntimeError on the console.
    recipe = variant(tmp_path, "crash", replace={"ready_timeout_s: 20": "ready_timeout_s: 600"})
    hf = hf_cache_with_model(tmp_path / "hf")
    sysfs = make_sysfs(tmp_path / "sys")
    run_dir = tmp_path / "run"
    os.environ.pop("HF_TOKEN", None)
    label_args = [x for k, v in docker_cleanup.labels.items() for x in ("--label", f"{k}={v}")]
    start = time.monotonic()
    code = main(
        [
            "smoke",
            "--image",
            smoke_image,
            "--recipe",
            str(recipe),
            "--run-dir",
            str(run_dir),
            "--hf-cache",
            str(hf),
            "--kfd-topology",
            str(nodes_dir(sysfs)),
            *label_args,
        ]
    )
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == ExitCode.SMOKE_FAILED, err
    assert SEED_LINE in err

    verdict = load_verdict(run_dir)
    assert verdict.status == "failed" and not verdict.passed
    assert verdict.reason == SEED_LINE  # verbatim
    ready = verdict.checks[0]
    assert ready.name == "server-ready" and ready.message == SEED_LINE
    assert ready.figures["detected_by"] == "traceback" and ready.figures["phase"] == "startup"
    assert "Traceback (most recent call last):" in ready.evidence
    assert [c.status for c in verdict.checks[1:]] == ["skipped"] * 3
    assert "detect_to_verdict_s" in verdict.timings
    junit = ET.parse(run_dir / "junit.xml").getroot()
    assert junit.find("testcase/failure").get("message") == SEED_LINE  # type: ignore[union-attr]
    # measured, not asserted (no timed asserts): see bench/bench_smoke_crash.py
    print(
        f"detection to verdict {verdict.timings['detect_to_verdict_s']:.2f} s; whole run {elapsed:.1f} s "
        f"(readiness limit 600 s)"
    )
    no_container_left(engine, docker_cleanup)


def test_never_ready_hits_the_time_limit(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe = variant(tmp_path, "never-ready", replace={"ready_timeout_s: 20": "ready_timeout_s: 3"})
    verdict, _run_dir, _ = smoke(engine, smoke_image, recipe, tmp_path, docker_cleanup)
    assert verdict.status == "failed"
    assert verdict.reason.startswith("server not ready within 3 s (/health: ")
    assert verdict.checks[0].limits["ready_timeout_s"] == 3
    assert verdict.checks[0].figures["waited_s"] >= 3
    assert "loading model weights" in verdict.checks[0].evidence
    assert [c.status for c in verdict.checks[1:]] == ["skipped"] * 3
    no_container_left(engine, docker_cleanup)


def test_wrong_answers_fail_the_accuracy_gate(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe = variant(tmp_path, "wrong")
    verdict, _run_dir, _ = smoke(engine, smoke_image, recipe, tmp_path, docker_cleanup)
    assert verdict.status == "failed"
    by_name = {c.name: c for c in verdict.checks}
    assert by_name["chat"].status == "passed"
    gsm = by_name["gsm8k"]
    assert gsm.status == "failed" and gsm.figures["value"] == 0.0
    assert verdict.reason == gsm.message and "below the reference 0.9363" in gsm.message
    assert by_name["serving-benchmark[c4]"].status == "skipped"  # stop at the first failing gate
    no_container_left(engine, docker_cleanup)


def test_wrong_answers_with_run_all_still_run_the_benchmark(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe = variant(tmp_path, "wrong")
    verdict, _, _ = smoke(engine, smoke_image, recipe, tmp_path, docker_cleanup, run_all=True)
    assert verdict.status == "failed" and verdict.reason.startswith("gsm8k ")
    assert [c.status for c in verdict.checks] == ["passed", "passed", "failed", "passed"]


def test_slow_answers_fail_the_benchmark_gate(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe = variant(tmp_path, "slow")
    verdict, run_dir, _ = smoke(engine, smoke_image, recipe, tmp_path, docker_cleanup)
    assert verdict.status == "failed"
    bench = verdict.checks[-1]
    assert bench.name == "serving-benchmark[c4]" and bench.status == "failed"
    assert "mean TPOT" in bench.message and "mean TTFT" in bench.message
    assert bench.figures["mean_tpot_ms"] > bench.limits["max_mean_tpot_ms"]
    assert [c.status for c in verdict.checks[:-1]] == ["passed", "passed", "passed"]
    assert "FAILED" in (run_dir / "summary.md").read_text()
    svg = (run_dir / "benchmark.svg").read_text()  # the failing row, marked failing in every panel
    assert {'id="row-c4-failed-mean_tpot_ms"', 'id="row-c4-failed-mean_ttft_ms"'} <= set(
        re.findall(r'id="row-c\d+-\w+-\w+"', svg)
    )
    assert "failed rows: c4" in svg
    no_container_left(engine, docker_cleanup)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_mid_run_leaves_no_container(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup, sig: signal.Signals
) -> None:
    recipe = variant(tmp_path, "never-ready", replace={"ready_timeout_s: 20": "ready_timeout_s: 300"})
    hf = hf_cache_with_model(tmp_path / "hf")
    sysfs = make_sysfs(tmp_path / "sys")
    run_dir = tmp_path / "run"
    case = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "smoke",
            "--image",
            smoke_image,
            "--recipe",
            str(recipe),
            "--run-dir",
            str(run_dir),
            "--hf-cache",
            str(hf),
            "--kfd-topology",
            str(nodes_dir(sysfs)),
            "--label",
            f"{TEST_LABEL}={SESSION_ID}",
            "--label",
            f"{CASE_LABEL}={docker_cleanup.case_id}",
            "--label",
            f"interrupt-case={case}",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not engine.containers_with_label("interrupt-case", case):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the server container never appeared"
            time.sleep(0.1)
        time.sleep(1.0)  # mid-run: the server is "loading", the runner polls readiness
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert "interrupted" in err
    assert engine.containers_with_label("interrupt-case", case) == []
    verdict = load_verdict(run_dir)
    assert verdict.status == "error" and not verdict.passed and "interrupted" in verdict.reason


def test_token_never_lands_in_any_file(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    token = "hf_" + uuid.uuid4().hex + "SECRET"
    # The model is not cached: preflight passes on the token, which goes to the container;
    # the test server prints its whole environment (SMOKE_TEST_ECHO_ENV=1), token included.
    empty_cache = tmp_path / "empty-hf"
    empty_cache.mkdir()
    recipe = variant(tmp_path)
    verdict, run_dir, _ = smoke(
        engine, smoke_image, recipe, tmp_path, docker_cleanup, env={"HF_TOKEN": token}, hf_cache=empty_cache
    )
    assert verdict.passed, verdict.reason
    assert verdict.hardware["token"] == "HF_TOKEN" and not verdict.hardware["model_cached"]
    server_log = (run_dir / "server.log").read_text()
    assert "env HF_TOKEN=***" in server_log  # it was printed, and redacted on the way in
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"verdict.json", "summary.md", "junit.xml", "server.log", "pipeline.log"} <= {
        p.name for p in files
    }
    for path in files:
        assert token.encode() not in path.read_bytes(), path
    assert token not in " ".join(f"{k}={v}" for k, v in docker_cleanup.labels.items())
    no_container_left(engine, docker_cleanup)


def test_preflight_through_a_container_reads_the_engine_hosts_topology(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    """The remote-engine path (--docker-host ssh://...): the topology is read in a short-lived container."""
    recipe = load_recipe(TEST_RECIPE)
    hf = hf_cache_with_model(tmp_path / "hf")
    good = make_sysfs(tmp_path / "good")
    pf = run_preflight(
        engine,
        image=smoke_image,
        recipe=recipe,
        nodes_dir=str(nodes_dir(good)),
        hf_cache_raw=str(hf),
        env={},
        docker_host=None,
        via="container",
        labels=docker_cleanup.labels,
    )
    assert pf.via == "container" and pf.missing == [] and len(pf.gpus) == 4 and pf.model_cached
    bad = make_sysfs(tmp_path / "bad", gpus=2, gfx_target_version=90402)
    pf = run_preflight(
        engine,
        image=smoke_image,
        recipe=recipe,
        nodes_dir=str(nodes_dir(bad)),
        hf_cache_raw=str(tmp_path / "no"),
        env={},
        docker_host=None,
        via="container",
        labels=docker_cleanup.labels,
    )
    assert (
        pf.missing[0] == "4 gfx950 (MI355 (fake KFD topology)) GPU(s): found 0 (and 2 GPU(s) of another "
        "architecture: gfx942)"
    )
    assert "smoke-test/tiny-chat" in pf.missing[1] and "HF_TOKEN" in pf.missing[1]
    no_container_left(engine, docker_cleanup)


def test_no_hardware_is_its_own_exit_and_never_a_pass(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe = variant(tmp_path)
    with pytest.raises(NoHardware) as exc:
        smoke(engine, smoke_image, recipe, tmp_path, docker_cleanup, sysfs=make_sysfs(tmp_path / "s", gpus=1))
    assert exc.value.exit_code == ExitCode.NO_HARDWARE
    assert "4 gfx950" in str(exc.value) and "found 1" in str(exc.value)
    assert "--docker-host ssh://" in str(exc.value)
    verdict = load_verdict(tmp_path / "run")
    assert verdict.status == "no-hardware" and not verdict.passed and verdict.checks == []
    no_container_left(engine, docker_cleanup)


def test_container_preflight_on_a_host_without_kfd_is_no_hardware(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    """Like a remote engine on a host without the amdgpu driver: the topology path cannot be mounted."""
    recipe = load_recipe(TEST_RECIPE)
    with pytest.raises(NoHardware) as exc:
        run_preflight(
            engine,
            image=smoke_image,
            recipe=recipe,
            nodes_dir="/sys/class/kfd-absent/topology/nodes",
            hf_cache_raw=str(tmp_path),
            env={"HF_TOKEN": "t"},
            docker_host=None,
            via="container",
            labels=docker_cleanup.labels,
        )
    assert "/sys/class/kfd-absent/topology/nodes" in str(exc.value) and "KFD" in str(exc.value)
    no_container_left(engine, docker_cleanup)


def test_crash_during_the_benchmark_stops_with_its_exception_line(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    recipe = variant(tmp_path, "crash-mid-run")
    verdict, _, _ = smoke(engine, smoke_image, recipe, tmp_path, docker_cleanup, run_all=True)
    assert verdict.status == "failed"
    assert verdict.reason.startswith("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.")
    assert [c.status for c in verdict.checks] == ["passed", "passed", "passed", "failed"]
    bench = verdict.checks[-1]
    assert bench.figures["detected_by"] == "traceback" and bench.message == verdict.reason
    no_container_left(engine, docker_cleanup)
