"""Fixtures for the docker tier: a real engine, the local base image, real registries, cleanup.

Fixtures (use these names):

- ``engine`` (session): a connected ``pipeline.oci.engine.Engine``.  Fails (never skips) when no
  engine answers: run ``make setup``.
- ``base_image`` (session): the tag of the local debootstrap image (Debian bookworm minbase +
  python3; ``BASE_IMAGE`` below, overridable by ``$ATOM_PIPELINE_TEST_BASE_IMAGE``).  Nothing can
  be pulled on our machines: every test image is built FROM it.  Fails with "run make setup"
  when absent.
- ``docker_cleanup`` (function, autouse): a ``DockerCleanup``.  While a test runs, every
  ``Engine.build`` / ``run`` / ``tag`` / ``pull`` in this process (any Engine instance, also inside
  pipeline code) is recorded, and all of it is removed when the test ends: containers, tags, built
  images, and the layers a failed build leaves behind.  Also removed: everything carrying
  ``docker_cleanup.labels`` (pass them to ``build(labels=...)`` / ``run(labels=...)``; note the classic
  builder turns each build label into one extra ``LABEL`` step).  Register what you make by other
  means (the docker CLI, a subprocess) with ``docker_cleanup.image(ref)`` / ``.container(id)``.
  ``docker_cleanup.tag(name)`` gives a unique ``atom-pipeline-test/<name>-<id>:1`` for this test.
  Anything left with the session label is removed at the end of the session.
- ``smoke_image`` (session): the test server image (tests/servers/image.py): the base image, the
  real ``lm_eval`` at the pinned version (from the wheels ``make setup`` builds), a local
  GSM8K-format task and tests/servers at /opt/smoke.  Labelled with ``PAIR_LABEL_VALUE`` and
  ``INPUTS_LABEL_VALUE`` as a built image would be.
- ``registry`` (function): a Debian ``docker-registry`` (distribution 2.8) on 127.0.0.1 at a free
  port, storage in a tmp dir, no auth.  ``.host`` = ``127.0.0.1:PORT``, ``.url`` = ``http://...``.
  Docker treats 127.0.0.0/8 as an insecure (plain HTTP) registry by default.
- ``auth_registry`` (function): the same with htpasswd basic auth; ``.username``, ``.password``,
  ``.auth_config`` (for ``engine.push(..., auth_config=...)``).  Plain HTTP: distribution 2.8 does
  not require TLS for htpasswd and dockerd sends basic credentials to 127.0.0.0/8 over HTTP.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline import labels as image_labels
from pipeline.errors import BuildError, InfraError
from pipeline.oci.engine import BuiltImage, ContainerHandle, Engine, ImageInfo, created_layers
from tests.fixtures.procs import stop

BASE_IMAGE = os.environ.get("ATOM_PIPELINE_TEST_BASE_IMAGE", "atom-pipeline-test/bookworm-python3:1")
TEST_LABEL = "org.atom-image-pipeline.test"
CASE_LABEL = "org.atom-image-pipeline.test-case"
SESSION_ID = uuid.uuid4().hex[:12]
PAIR_LABEL_VALUE = "0" * 63 + "1"
INPUTS_LABEL_VALUE = "0" * 63 + "2"
REGISTRY_BIN = os.environ.get("ATOM_PIPELINE_TEST_REGISTRY_BIN", "/usr/bin/docker-registry")


# ---------------------------------------------------------------------------- engine


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    try:
        eng = Engine.connect()
    except InfraError as err:
        pytest.fail(
            f"The docker tier needs a Docker engine and none answers: {err}\nRun `make setup`.", pytrace=False
        )
    yield eng
    _remove_labelled(eng, TEST_LABEL, SESSION_ID)
    eng.close()


@pytest.fixture(scope="session")
def base_image(engine: Engine) -> str:
    if engine.image(BASE_IMAGE) is None:
        pytest.fail(
            f"The local test base image {BASE_IMAGE} is missing: run `make setup` (it builds it with "
            "debootstrap in about a minute).",
            pytrace=False,
        )
    return BASE_IMAGE


@pytest.fixture(scope="session")
def smoke_image(engine: Engine, base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.servers.image import build_smoke_image

    tag = f"atom-pipeline-test/smoke-server-{SESSION_ID}:1"
    try:
        build_smoke_image(
            engine,
            base_image,
            tmp_path_factory.mktemp("smoke-image"),
            tag=tag,
            labels={
                TEST_LABEL: SESSION_ID,
                image_labels.PAIR_DIGEST: PAIR_LABEL_VALUE,
                image_labels.INPUTS_DIGEST: INPUTS_LABEL_VALUE,
            },
        )
    except FileNotFoundError as err:
        pytest.fail(str(err), pytrace=False)
    yield tag
    engine.remove_image(tag, force=True)


def _remove_labelled(engine: Engine, key: str, value: str) -> list[str]:
    """Remove every container, then every image, carrying ``key=value``; what could not be removed."""
    left: list[str] = []
    for cid in engine.containers_with_label(key, value):
        with contextlib.suppress(Exception):
            engine.api.remove_container(cid, force=True, v=True)
    for info in engine.images_with_label(key, value):
        for ref in [*info.tags, info.id]:
            try:
                engine.remove_image(ref, force=True)
            except Exception as exc:  # keep going; report below
                left.append(f"{ref}: {exc}")
    return left


@dataclass
class DockerCleanup:
    """Everything one test made through ``Engine`` (recorded automatically) or registered by hand."""

    engine: Engine
    case_id: str
    images: list[str] = field(default_factory=list)  # refs (tags, digests) this test created
    built: list[str] = field(default_factory=list)  # image ids built, incl. layers of failed builds
    containers: list[str] = field(default_factory=list)

    @property
    def labels(self) -> dict[str, str]:
        return {TEST_LABEL: SESSION_ID, CASE_LABEL: self.case_id}

    def tag(self, name: str, version: str = "1") -> str:
        """A unique ``repo:tag`` for this test (registered for removal)."""
        ref = f"atom-pipeline-test/{name}-{self.case_id}:{version}"
        self.images.append(ref)
        return ref

    def image(self, ref: str) -> str:
        self.images.append(ref)
        return ref

    def container(self, cid: str) -> str:
        self.containers.append(cid)
        return cid

    def run(self) -> list[str]:
        left: list[str] = []
        for cid in self.containers:
            with contextlib.suppress(Exception):
                self.engine.api.remove_container(cid, force=True, v=True)
        left += _remove_labelled(self.engine, CASE_LABEL, self.case_id)
        for ref in reversed(self.images):
            try:
                self.engine.remove_image(ref)
            except Exception as exc:
                if self.engine.image(ref) is not None:
                    left.append(f"{ref}: {exc}")
        # built ids last, newest first: remove only if no tag is left (a tag we did not make is not ours)
        for image_id in reversed(self.built):
            info = self.engine.image(image_id)
            if info is None or info.tags:
                continue
            try:
                self.engine.remove_image(image_id)
            except Exception as exc:
                if self.engine.image(image_id) is not None and "has dependent child images" not in str(exc):
                    left.append(f"{image_id}: {exc}")
        return left


@pytest.fixture(autouse=True)
def docker_cleanup(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[DockerCleanup]:
    """Autouse: records what every ``Engine`` in this process builds, runs, tags and pulls during the
    test, and removes it (and everything labelled with ``docker_cleanup.labels``) afterwards."""
    tracker = DockerCleanup(engine, uuid.uuid4().hex[:10])
    real_build, real_run, real_tag, real_pull = Engine.build, Engine.run, Engine.tag, Engine.pull

    def build(self: Engine, *args: Any, **kwargs: Any) -> BuiltImage:
        try:
            built = real_build(self, *args, **kwargs)
        except BuildError as err:
            tracker.built += created_layers(err.evidence or "")
            raise
        tracker.built += [*created_layers(built.log), built.id]
        if kwargs.get("tag"):
            tracker.images.append(str(kwargs["tag"]))
        return built

    def run(self: Engine, *args: Any, **kwargs: Any) -> ContainerHandle:
        handle = real_run(self, *args, **kwargs)
        tracker.containers.append(handle.id)
        return handle

    def tag(self: Engine, image: str, repo: str, tag: str) -> None:
        real_tag(self, image, repo, tag)
        tracker.images.append(f"{repo}:{tag}")

    def pull(self: Engine, ref: str, *args: Any, **kwargs: Any) -> ImageInfo:
        existed = self.image(ref) is not None
        info = real_pull(self, ref, *args, **kwargs)
        if not existed:
            tracker.images.append(ref)
        return info

    monkeypatch.setattr(Engine, "build", build)
    monkeypatch.setattr(Engine, "run", run)
    monkeypatch.setattr(Engine, "tag", tag)
    monkeypatch.setattr(Engine, "pull", pull)
    yield tracker
    monkeypatch.undo()
    left = tracker.run()
    if left:
        pytest.fail("Could not clean up after the test: " + "; ".join(left), pytrace=False)


# ---------------------------------------------------------------------------- registry


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    url: str  # http://127.0.0.1:PORT
    root: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    username: str | None = None
    password: str | None = None

    @property
    def auth_config(self) -> dict[str, str] | None:
        if self.username is None or self.password is None:
            return None
        return {"username": self.username, "password": self.password}

    def repo(self, name: str) -> str:
        return f"{self.host}/{name}"

    def __repr__(self) -> str:  # never the password
        return f"Registry({self.url!r}, auth={self.username is not None})"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bcrypt_hash(password: str) -> str:
    import bcrypt  # test dependency: distribution's htpasswd only accepts bcrypt

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()


def _wait_for_registry(reg: Registry, timeout: float = 15) -> bool:
    """True once our registry process answers /v2/; False (process stopped) if it exits or never answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if reg.process.poll() is not None:
            return False
        try:
            urllib.request.urlopen(f"{reg.url}/v2/", timeout=1).close()
        except urllib.error.HTTPError as exc:  # 401 from the auth registry: it is up
            if exc.code != 401:
                raise
        except OSError:
            time.sleep(0.1)
            continue
        time.sleep(0.2)  # the answer must come from our process, not one that held the port
        return reg.process.poll() is None
    reg.process.kill()
    reg.process.wait()
    return False


@contextlib.contextmanager
def _start_registry(
    root: Path, *, username: str | None = None, password: str | None = None
) -> Iterator[Registry]:
    if not os.access(REGISTRY_BIN, os.X_OK):
        pytest.fail(
            f"{REGISTRY_BIN} is missing: run `make setup` (Debian package docker-registry).", pytrace=False
        )
    storage = root / "storage"
    storage.mkdir(parents=True)
    auth = ""
    if username is not None and password is not None:
        htpasswd = root / "htpasswd"
        htpasswd.write_text(f"{username}:{_bcrypt_hash(password)}\n")
        auth = f"auth:\n  htpasswd:\n    realm: atom-pipeline-test\n    path: {htpasswd}\n"
    log_path = root / "registry.log"
    config = root / "config.yml"
    for attempt in range(3):  # a free port can be taken between our probe and the registry's bind
        port = _free_port()
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: info\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(16)}\n" + auth
        )
        with log_path.open("wb") as logf:
            proc = subprocess.Popen(
                [REGISTRY_BIN, "serve", str(config)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        reg = Registry(
            f"127.0.0.1:{port}", f"http://127.0.0.1:{port}", root, proc, log_path, username, password
        )
        if _wait_for_registry(reg):
            break
        if "address already in use" in log_path.read_text() and attempt < 2:
            continue
        pytest.fail(
            f"docker-registry did not come up on {reg.url} (exit {proc.returncode}):\n"
            f"{log_path.read_text()[-3000:]}",
            pytrace=False,
        )
    try:
        yield reg
    finally:
        stop(proc, timeout=10)
        shutil.rmtree(storage, ignore_errors=True)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with _start_registry(tmp_path / "registry") as reg:
        yield reg


@pytest.fixture
def auth_registry(tmp_path: Path) -> Iterator[Registry]:
    with _start_registry(
        tmp_path / "auth-registry", username="pipeline-ci", password="pw-" + secrets.token_hex(12)
    ) as reg:
        yield reg


@pytest.fixture
def second_engine() -> Iterator[tuple[Engine, str]]:
    """Another host's engine: a second dockerd with its own bridge, and its DOCKER_HOST address."""
    from tests.fixtures.second_engine import second_dockerd

    try:
        with second_dockerd() as found:
            yield found
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def sshd_host(tmp_path: Path) -> Iterator[Any]:
    """The suite's engine behind the real sshd: a host reached over `ssh://` (tests.servers.sshd)."""
    from tests.servers.sshd import start_sshd

    try:
        with start_sshd(tmp_path / "sshd") as server:
            yield server
    except FileNotFoundError as err:
        pytest.fail(str(err), pytrace=False)
