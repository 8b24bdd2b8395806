"""Test tiers, decided by directory.

- ``tests/unit/``   marker ``unit``: no docker, no network, no subprocess.  An autouse fixture
  makes ``subprocess.Popen`` (so ``subprocess.run``/``check_output``, gitpython, ...),
  ``os.system``, ``os.popen``, ``os.posix_spawn*``, the docker SDK clients and outbound
  (non-unix) socket connections raise ``ForbiddenInUnitTest``.
- ``tests/git/``    marker ``git``: real git repositories made by the tests in tmp dirs.
- ``tests/docker/`` marker ``docker``: a real Docker engine and registry (see tests/docker/conftest.py).

Every test gets exactly one tier marker; a test file outside these directories is an error.
Run one tier with ``python -m pytest tests/unit`` (or ``-m unit``).
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent
TIERS = ("unit", "git", "docker")


class ForbiddenInUnitTest(RuntimeError):
    """Raised when a unit-tier test tries to start a process, reach Docker or the network."""


def tier_of(path: Path) -> str | None:
    try:
        rel = Path(path).resolve().relative_to(TESTS_DIR)
    except ValueError:
        return None
    return rel.parts[0] if rel.parts and rel.parts[0] in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(
                f"{item.nodeid}: every test lives in tests/unit, tests/git or tests/docker (the directory "
                "decides its tier)."
            )
        item.add_marker(getattr(pytest.mark, tier))


def _forbidden(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ForbiddenInUnitTest(
            f"{what} is forbidden in unit tests (tests/unit): no subprocess, no Docker, no network. "
            "Use a fake, or move the test to tests/git or tests/docker."
        )

    return refuse


class _RefusingPopen:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _forbidden(f"subprocess.Popen({args[0] if args else kwargs.get('args')!r})")()


@pytest.fixture(autouse=True)
def _unit_tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if tier_of(request.node.path) != "unit":
        yield
        return
    # GitPython runs `git version` when first imported: let that happen before the guard, so a unit
    # test's outcome does not depend on whether an earlier test imported it.
    import git  # noqa: F401

    monkeypatch.setattr(subprocess, "Popen", _RefusingPopen)
    monkeypatch.setattr(os, "system", _forbidden("os.system"))
    monkeypatch.setattr(os, "popen", _forbidden("os.popen"))
    for name in ("posix_spawn", "posix_spawnp", "fork", "forkpty"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _forbidden(f"os.{name}"))
    for name in ("execv", "execve", "execvp", "execvpe"):
        monkeypatch.setattr(os, name, _forbidden(f"os.{name}"))

    try:
        import docker
        import docker.api.client
    except ImportError:  # pragma: no cover - docker is a dependency
        pass
    else:
        monkeypatch.setattr(docker, "from_env", _forbidden("docker.from_env"))
        monkeypatch.setattr(docker, "DockerClient", _forbidden("docker.DockerClient"))
        monkeypatch.setattr(docker, "APIClient", _forbidden("docker.APIClient"))
        # however it is reached (docker.client.DockerClient creates one internally)
        monkeypatch.setattr(docker.api.client.APIClient, "__init__", _forbidden("docker.APIClient"))

    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def guard(sock: socket.socket, address: Any, real: Any) -> Any:
        if sock.family == getattr(socket, "AF_UNIX", None):
            # unix sockets: allowed unless it is Docker's
            if isinstance(address, str | bytes) and "docker" in os.fsdecode(address):
                _forbidden(f"connecting to {address!r}")()
            return real(sock, address)
        _forbidden(f"a network connection to {address!r}")()

    monkeypatch.setattr(socket.socket, "connect", lambda self, addr: guard(self, addr, real_connect))
    monkeypatch.setattr(socket.socket, "connect_ex", lambda self, addr: guard(self, addr, real_connect_ex))
    yield


@pytest.fixture(autouse=True)
def _git_identity(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """git/docker tiers: a fixed git identity and no user/system git config leaking in."""
    if tier_of(request.node.path) not in ("git", "docker"):
        return
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Pipeline Test")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "pipeline-test@example.invalid")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Pipeline Test")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "pipeline-test@example.invalid")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    global_config = tmp_path / ".gitconfig-test"
    global_config.write_text('[init]\n\tdefaultBranch = main\n[protocol "file"]\n\tallow = always\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(global_config))


@pytest.fixture(autouse=True)
def _image_build_defaults(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """git/docker tiers: how test images are built (unless a test sets it): from the real wheelhouse
    `scripts/setup.sh wheelhouse` downloads for the base image's python, offline (containers
    cannot reach PyPI), on a base image without git (debootstrap minbase)."""
    if tier_of(request.node.path) not in ("git", "docker"):
        return
    from tests.fixtures.build_repos import TEST_BASE_PYTHON, test_wheelhouse

    defaults = {
        "PIPELINE_WHEELS_DIR": str(test_wheelhouse()),
        "PIPELINE_PYTHON_VERSION": TEST_BASE_PYTHON,
        "PIPELINE_OFFLINE_BUILD": "1",
        "PIPELINE_REQUIRE_GIT": "0",
    }
    for key, value in defaults.items():
        if key not in os.environ:
            monkeypatch.setenv(key, value)
