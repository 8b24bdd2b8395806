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

import contextlib
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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline import labels
from pipeline.cli import main
from pipeline.config import Settings, load_settings
from pipeline.errors import ExitCode, InfraError, NoHardware
from pipeline.fsutil import sha256_file
from pipeline.log import Logger
from pipeline.oci.engine import Engine
from pipeline.recipes.recipe import load_recipe
from pipeline.smoke import SmokeOptions, Verdict, load_verdict, run_smoke
from pipeline.smoke.preflight import run_preflight
from tests.docker.conftest import (
    CASE_LABEL,
    INPUTS_LABEL_VALUE,
    PAIR_LABEL_VALUE,
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
    assert verdict.pair_digest == PAIR_LABEL_VALUE and verdict.inputs_digest == INPUTS_LABEL_VALUE
    assert verdict.lock_sha256 == ""  # no lock given: the verdict binds none (tag refuses it)
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


# ---------------------------------------------------------------------------- who answered (issue 13.1)


def host_variant(tmp_path: Path, mode: str, port: int, *, ready_timeout: int = 20) -> Path:
    """The test recipe with host networking on `port`, as the real MiniMax recipes serve."""
    return variant(
        tmp_path,
        mode,
        replace={
            "network_mode: bridge": "network_mode: host",
            "port: 8000": f"port: {port}",
            "ready_timeout_s: 20": f"ready_timeout_s: {ready_timeout}",
        },
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def smoke_cli(
    image: str, recipe: Path, run_dir: Path, tmp_path: Path, cleanup: DockerCleanup, *extra: str
) -> subprocess.Popen[str]:
    hf = hf_cache_with_model(tmp_path / f"hf-{uuid.uuid4().hex[:6]}")
    sysfs = make_sysfs(tmp_path / f"sys-{uuid.uuid4().hex[:6]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env["PYTHONPATH"] = str(REPO)
    labels_args = [x for k, v in cleanup.labels.items() for x in ("--label", f"{k}={v}")]
    return subprocess.Popen(
        [
            sys.executable, "-m", "pipeline", "smoke", "--image", image, "--recipe", str(recipe),
            "--run-dir", str(run_dir), "--hf-cache", str(hf), "--kfd-topology", str(nodes_dir(sysfs)),
            *labels_args, *extra,
        ],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def leaked_server(
    engine: Engine, image: str, port: int, cleanup: DockerCleanup, owner_labels: dict[str, str]
) -> str:
    """A healthy test server on the host's `port`, as a killed run leaves it; its container id."""
    c = engine.run(
        image,
        ["python3", "/opt/smoke/openai_server.py", "--model", "smoke-test/tiny-chat", "--port", str(port)],
        name=f"atom-smoke-leaked-{uuid.uuid4().hex[:8]}",
        environment={"SMOKE_TEST_MODE": "healthy", "SMOKE_TEST_WARMUP_S": "0.2"},
        network_mode="host",
        labels={**cleanup.labels, **owner_labels},
    )
    deadline = time.monotonic() + 30
    while not answers(port):
        assert time.monotonic() < deadline, "the leaked server never answered"
        time.sleep(0.1)
    return c.id


def test_sigkilled_runs_server_is_removed_and_never_answers_the_next_run(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    """The sequence that published a broken image: kill -9 a run after readiness, smoke a broken
    image on the same port with host networking. Before the fix the leaked server answered and the
    broken image passed in 2 s; now the leftover is removed first and the crash is the verdict."""
    port = free_port()
    first = smoke_cli(
        smoke_image, host_variant(tmp_path, "healthy", port), tmp_path / "run1", tmp_path, docker_cleanup
    )
    try:
        deadline = time.monotonic() + 60
        while not answers(port):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run's server never became ready"
            time.sleep(0.1)
        first.kill()  # SIGKILL: no cleanup can run
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    leaked = [c for c in engine.containers(CASE_LABEL, docker_cleanup.case_id) if c.status == "running"]
    assert len(leaked) == 1 and answers(port)  # the leak the issue saw
    assert leaked[0].labels[labels.OWNER_PID] == str(first.pid)

    broken = host_variant(tmp_path, "crash", port, ready_timeout=600)
    start = time.monotonic()
    second = smoke_cli(smoke_image, broken, tmp_path / "run2", tmp_path, docker_cleanup)
    _out, err = second.communicate(timeout=300)
    elapsed = time.monotonic() - start
    assert second.returncode == ExitCode.SMOKE_FAILED, err
    assert "removed leftover container" in err and leaked[0].name in err
    verdict = load_verdict(tmp_path / "run2")
    assert verdict.status == "failed" and verdict.reason == SEED_LINE
    assert verdict.server is None  # no server of this run ever answered
    assert [(x["id"], x["removed"], x["owner"]) for x in verdict.leftovers] == [(leaked[0].id, True, "gone")]
    assert engine.container(leaked[0].id) is None and not answers(port)
    no_container_left(engine, docker_cleanup)
    print(
        f"FAULT | leaked server of a SIGKILLed run + broken image | exit {second.returncode} | "
        f"containers left 0 (leftover removed) | {elapsed:.2f} s"
    )


def test_port_held_by_a_live_runs_server_refuses_with_exit_11_and_leaves_it_alone(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    """Another run (another helper, CI, a second terminal) owns the server: reported, never touched."""
    from pipeline.smoke.identity import Owner

    port = free_port()
    other = subprocess.Popen(["sleep", "300"])
    try:
        me = Owner.current()
        owner = Owner(me.host, other.pid, _start_time(other.pid), me.boot, me.pidns)
        cid = leaked_server(engine, smoke_image, port, docker_cleanup, owner.labels("0therrun"))
        start = time.monotonic()
        proc = smoke_cli(
            smoke_image, host_variant(tmp_path, "crash", port), tmp_path / "run", tmp_path, docker_cleanup
        )
        _out, err = proc.communicate(timeout=300)
        elapsed = time.monotonic() - start
        assert proc.returncode == ExitCode.INFRA, err
        assert f"port {port} on the engine's host is already taken" in err
        assert "of smoke run 0therrun" in err and f"pid {other.pid}" in err and "still running" in err
        assert "left alone" in err
        info = engine.container(cid)
        assert info is not None and info.status == "running"  # not ours to remove
        verdict = load_verdict(tmp_path / "run")
        assert verdict.status == "error" and not verdict.passed and verdict.checks == []
        # the leaked one is reported and kept (other runs' live servers on this shared engine may be too)
        assert [x["removed"] for x in verdict.leftovers if x["id"] == cid] == [False]
        # only the leaked one is left: the refused run started no server
        running = engine.containers(CASE_LABEL, docker_cleanup.case_id)
        assert [c.id for c in running] == [cid]
        print(
            f"FAULT | port held by a live run's server | exit {proc.returncode} | "
            f"containers left 0 of ours (theirs kept) | {elapsed:.2f} s"
        )
    finally:
        other.kill()
        other.wait()


def _start_time(pid: int) -> str:
    from pipeline.smoke.identity import process_start

    return process_start(pid)


def test_port_held_by_a_host_process_refuses_naming_it(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    port = free_port()
    holder = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import socket

        deadline = time.monotonic() + 20
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        start = time.monotonic()
        with pytest.raises(InfraError) as exc:
            smoke(engine, smoke_image, host_variant(tmp_path, "healthy", port), tmp_path, docker_cleanup)
        elapsed = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    print(
        f"FAULT | port held by a host process | exit {exc.value.exit_code} | containers left 0 | "
        f"{elapsed:.2f} s"
    )
    assert exc.value.exit_code == ExitCode.INFRA
    assert f"process {holder.pid}" in str(exc.value) and "http.server" in str(exc.value)
    assert load_verdict(tmp_path / "run").status == "error"
    no_container_left(engine, docker_cleanup)


def test_a_foreign_listener_is_caught_after_readiness_before_any_gate(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Layer 2 alone: the port check is skipped (as if the port were taken just after it), the
    broken server is still warming up, and a leaked server answers /health. The listener proof
    refuses the run before any gate counts, naming the holder."""
    import pipeline.smoke.runner

    port = free_port()
    cid = leaked_server(engine, smoke_image, port, docker_cleanup, {})  # no owner labels at all
    monkeypatch.setattr(pipeline.smoke.runner, "check_port_free", lambda *a, **k: None)
    broken = variant(
        tmp_path,
        "crash",
        replace={
            "network_mode: bridge": "network_mode: host",
            "port: 8000": f"port: {port}",
            'SMOKE_TEST_WARMUP_S: "1"': 'SMOKE_TEST_WARMUP_S: "30"',
        },
    )
    start = time.monotonic()
    with pytest.raises(InfraError) as exc:
        smoke(engine, smoke_image, broken, tmp_path, docker_cleanup)
    elapsed = time.monotonic() - start
    text = str(exc.value)
    assert "outside this run's container" in text and "no gate counts" in text
    leaked_name = engine.container(cid).name  # type: ignore[union-attr]
    assert leaked_name in text
    verdict = load_verdict(tmp_path / "run")
    assert verdict.status == "error" and not verdict.passed and verdict.server is None
    assert [c.name for c in verdict.checks] == ["server-ready"]  # no gate ran
    engine.remove_container(cid)
    no_container_left(engine, docker_cleanup)
    print(
        f"FAULT | foreign listener answers after the port check | exit {exc.value.exit_code} | "
        f"containers left 0 of ours | {elapsed:.2f} s"
    )


def test_healthy_host_network_run_records_whom_it_talked_to(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    port = free_port()
    recipe = host_variant(tmp_path, "healthy", port)
    verdict, _, _ = smoke(engine, smoke_image, recipe, tmp_path, docker_cleanup)
    assert verdict.passed, verdict.reason
    server = verdict.server
    info = engine.image(smoke_image)
    assert server is not None and info is not None
    assert server.image_id == info.id and server.port == port and server.network_mode == "host"
    assert server.container_name.startswith("atom-smoke-") and len(server.container_id) == 64
    assert server.checked == ["after readiness, before any gate", "after the last gate"]
    assert server.pids and any(f":{port} inode " in x for x in server.listeners)
    no_container_left(engine, docker_cleanup)


# ---------------------------------------------------------------------------- faults (issue 13.2, 13.4)


def wait_for_container(engine: Engine, key: str, value: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not engine.containers_with_label(key, value):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the server container never appeared"
        time.sleep(0.1)


@pytest.mark.parametrize("count", [1, 2], ids=["once", "twice-50ms-apart"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupts_mid_run_exit_130_leave_no_container_and_say_so(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    sig: signal.Signals,
    count: int,
) -> None:
    """Ctrl-C / SIGTERM, also twice 50 ms apart (once the reason was Docker's 409 "removal already
    in progress", with exit 11)."""
    recipe = variant(tmp_path, "never-ready", replace={"ready_timeout_s: 20": "ready_timeout_s: 300"})
    case = uuid.uuid4().hex
    proc = smoke_cli(
        smoke_image, recipe, tmp_path / "run", tmp_path, docker_cleanup, "--label", f"dbl={case}"
    )
    try:
        wait_for_container(engine, "dbl", case, proc)
        time.sleep(1.0)  # mid-run: the server is "loading", the runner polls readiness
        start = time.monotonic()
        for i in range(count):
            if i:
                time.sleep(0.05)
            proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert "409" not in err and "removal already in progress" not in err
    assert "every container this run started was removed" in err
    assert engine.containers_with_label("dbl", case) == []
    verdict = load_verdict(tmp_path / "run")
    assert verdict.status == "error" and "interrupted" in verdict.reason and "409" not in verdict.reason
    print(f"FAULT | {sig.name} x{count} | exit {proc.returncode} | containers left 0 | {elapsed:.2f} s")


def test_a_killed_rerun_never_leaves_the_earlier_pass_as_its_verdict(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup
) -> None:
    verdict, run_dir, _ = smoke(engine, smoke_image, variant(tmp_path), tmp_path, docker_cleanup)
    assert verdict.passed
    other = variant(tmp_path, "never-ready", replace={"name: Smoke-Test-Tiny": "name: Other-Recipe"})
    case = uuid.uuid4().hex
    proc = smoke_cli(smoke_image, other, run_dir, tmp_path, docker_cleanup, "--label", f"rerun={case}")
    try:
        wait_for_container(engine, "rerun", case, proc)
        log_file = run_dir / "server.log"
        deadline = time.monotonic() + 60
        while not (log_file.is_file() and "loading model weights" in log_file.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.kill()  # SIGKILL: the re-run writes nothing more
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (run_dir / "verdict.json").exists()  # no stale pass to be read as this run's
    assert not (run_dir / "summary.md").exists()
    earlier = load_verdict(run_dir / "earlier" / "1")
    assert earlier.passed and earlier.recipe.name == "Smoke-Test-Tiny"
    log = (run_dir / "server.log").read_text()
    assert "Starting server" not in log and "loading model weights" in log  # one run per server.log
    assert "Starting server" in (run_dir / "earlier" / "1" / "server.log").read_text()
    print(
        "FAULT | SIGKILLed re-run over an earlier pass | killed (-9) | verdict.json absent, "
        "earlier pass in earlier/1 | -"
    )


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount a tmpfs of a given size (optionally read-only) under tmp_path; unmounted afterwards."""
    mounts: list[Path] = []

    def make(size: str, *, read_only: bool = False) -> Path:
        mnt = tmp_path / f"fs-{len(mounts)}"
        mnt.mkdir()
        opts = f"size={size}" + (",ro" if read_only else "")
        subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], check=True)
        mounts.append(mnt)
        return mnt

    yield make
    for mnt in mounts:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_nearly_full_run_directory_refuses_before_any_container(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    small_fs: Callable[..., Path],
) -> None:
    full = small_fs("1m")
    (full / "filler").write_bytes(b"x" * (1024 * 1024 - 48 * 1024))  # 48 KiB left, as in the issue
    run_dir = full / "run"
    start = time.monotonic()
    proc = smoke_cli(smoke_image, variant(tmp_path), run_dir, tmp_path, docker_cleanup)
    _out, err = proc.communicate(timeout=120)
    print(
        f"FAULT | run dir with 48 KiB free | exit {proc.returncode} | containers left 0 | "
        f"{time.monotonic() - start:.2f} s"
    )
    assert proc.returncode == ExitCode.DISK, err
    assert "Traceback" not in err and "internal error" not in err
    assert "KiB free; a smoke run needs at least 32 MiB" in err
    assert engine.containers_with_label(CASE_LABEL, docker_cleanup.case_id) == []
    assert not (run_dir / "summary.md").exists() and not (run_dir / "verdict.json").exists()


def test_a_read_only_run_directory_is_its_own_error(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    small_fs: Callable[..., Path],
) -> None:
    ro = small_fs("1m", read_only=True)
    start = time.monotonic()
    proc = smoke_cli(smoke_image, variant(tmp_path), ro / "run", tmp_path, docker_cleanup)
    _out, err = proc.communicate(timeout=120)
    print(
        f"FAULT | read-only run dir | exit {proc.returncode} | containers left 0 | "
        f"{time.monotonic() - start:.2f} s"
    )
    assert proc.returncode == ExitCode.DISK, err
    assert "read-only" in err and "Traceback" not in err
    assert engine.containers_with_label(CASE_LABEL, docker_cleanup.case_id) == []


def test_a_disk_that_fills_during_the_run_removes_the_container_and_never_says_passed(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    small_fs: Callable[..., Path],
) -> None:
    fs = small_fs("40m")
    run_dir = fs / "run"
    recipe = variant(tmp_path, replace={'SMOKE_TEST_WARMUP_S: "1"': 'SMOKE_TEST_WARMUP_S: "3"'})
    case = uuid.uuid4().hex
    proc = smoke_cli(smoke_image, recipe, run_dir, tmp_path, docker_cleanup, "--label", f"fill={case}")
    try:
        wait_for_container(engine, "fill", case, proc)
        # fill the disk while the server warms up
        with contextlib.suppress(OSError), (fs / "filler").open("wb") as f:
            while True:
                f.write(b"x" * 65536)
                f.flush()
        start = time.monotonic()
        _out, err = proc.communicate(timeout=120)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.DISK, err
    assert "is full (ENOSPC)" in err and "Traceback" not in err
    assert engine.containers_with_label("fill", case) == []  # removed, although nothing could be written
    summary = run_dir / "summary.md"
    assert not summary.exists() or "PASSED" not in summary.read_text()
    if (run_dir / "verdict.json").exists():
        assert not load_verdict(run_dir).passed
    print(
        f"FAULT | disk fills during warm-up | exit {proc.returncode} | containers left 0 | "
        f"{elapsed:.2f} s after the disk filled"
    )
