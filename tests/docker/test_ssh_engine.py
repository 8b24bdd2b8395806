"""`pipeline smoke --docker-host ssh://...` through a real sshd (tests/servers/sshd.py).

Debian's OpenSSH server on 127.0.0.1 fronts the local dockerd, as a GPU host's sshd fronts its
engine: the Docker SDK runs the real ``ssh`` client, which runs ``docker system dial-stdio`` on
the "remote" side. Preflight reads the KFD topology there (in a short-lived container on that
engine, as for any remote engine). A wrong host key, a refused login and sessions dropped
mid-run are each an infrastructure error (exit 11): never a verdict of "passed", and no
container left on the remote engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.oci.engine import Engine
from pipeline.smoke import load_verdict
from tests.docker.conftest import DockerCleanup
from tests.docker.test_smoke import hf_cache_with_model, no_container_left, variant
from tests.fixtures.sysfs import make_sysfs, nodes_dir
from tests.servers.sshd import Sshd, start_sshd

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sshd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sshd]:
    try:
        with start_sshd(tmp_path / "sshd") as server:
            monkeypatch.setenv("PATH", server.env_path)  # our `ssh`: the real client, our config
            yield server
    except FileNotFoundError as err:
        pytest.fail(str(err), pytrace=False)


def smoke_args(
    tmp_path: Path, image: str, recipe: Path, docker_host: str, cleanup: DockerCleanup, *extra: str
) -> list[str]:
    labels = [x for k, v in cleanup.labels.items() for x in ("--label", f"{k}={v}")]
    return [
        "smoke",
        "--image",
        image,
        "--recipe",
        str(recipe),
        "--run-dir",
        str(tmp_path / "run"),
        "--hf-cache",
        str(hf_cache_with_model(tmp_path / "hf")),
        "--kfd-topology",
        str(nodes_dir(make_sysfs(tmp_path / "sys"))),
        "--docker-host",
        docker_host,
        *labels,
        *extra,
    ]


def test_preflight_and_smoke_through_ssh(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    sshd: Sshd,
    capsys: pytest.CaptureFixture[str],
) -> None:
    os.environ.pop("HF_TOKEN", None)
    recipe = variant(tmp_path, replace={"limit: 60": "limit: 8"})
    code = main(smoke_args(tmp_path, smoke_image, recipe, sshd.docker_host, docker_cleanup))
    err = capsys.readouterr().err
    assert code == 0, err
    verdict = load_verdict(tmp_path / "run")
    assert verdict.passed and verdict.engine == sshd.docker_host
    # the topology was read on the engine's side of the ssh connection, in a container there
    assert verdict.hardware["via"] == "container" and len(verdict.hardware["gpus"]) == 4
    assert [c.status for c in verdict.checks] == ["passed"] * 4
    assert "Accepted publickey for root" in sshd.log()
    no_container_left(engine, docker_cleanup)


@pytest.mark.parametrize("fault", ["wrong-host-key", "refused-login"])
def test_an_ssh_engine_that_cannot_be_reached_is_exit_11(
    engine: Engine,
    smoke_image: str,
    tmp_path: Path,
    docker_cleanup: DockerCleanup,
    sshd: Sshd,
    capsys: pytest.CaptureFixture[str],
    fault: str,
) -> None:
    if fault == "wrong-host-key":
        sshd.wrong_host_key()
    else:
        sshd.refuse_login()
    recipe = variant(tmp_path)
    code = main(smoke_args(tmp_path, smoke_image, recipe, sshd.docker_host, docker_cleanup))
    err = capsys.readouterr().err
    assert code == ExitCode.INFRA, err
    assert f"No Docker engine answers at {sshd.docker_host}" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert not (run / "verdict.json").exists() or not load_verdict(run).passed
    log = sshd.log()
    assert ("Failed publickey" in log) if fault == "refused-login" else ("Accepted publickey" not in log)
    no_container_left(engine, docker_cleanup)


def test_sessions_dropped_mid_run_are_exit_11_and_leave_no_container(
    engine: Engine, smoke_image: str, tmp_path: Path, docker_cleanup: DockerCleanup, sshd: Sshd
) -> None:
    recipe = variant(tmp_path, "never-ready", replace={"ready_timeout_s: 20": "ready_timeout_s: 300"})
    case = uuid.uuid4().hex
    args = smoke_args(
        tmp_path, smoke_image, recipe, sshd.docker_host, docker_cleanup, "--label", f"drop={case}"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *args],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        server_log = tmp_path / "run" / "server.log"  # the server container runs, its log streams
        while "loading model weights" not in (server_log.read_text() if server_log.exists() else ""):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the server container never logged"
            time.sleep(0.2)
        time.sleep(2.0)  # mid-run: the server is "loading", the runner streams its log and polls
        assert sshd.drop_sessions() >= 1
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.INFRA, err
    assert "Traceback" not in err
    verdict = load_verdict(tmp_path / "run")
    assert verdict.status == "error" and not verdict.passed
    assert engine.containers_with_label("drop", case) == []  # removed through a new ssh session
    no_container_left(engine, docker_cleanup)
