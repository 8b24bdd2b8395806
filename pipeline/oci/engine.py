"""The Docker engine, wrapped once.

Everything in the pipeline that talks to Docker goes through this module; it
turns every ``docker.errors.*`` and ``requests`` connection error into one of
ours (``InfraError``, ``BuildError``, ``TagError``) while keeping the evidence
(build log, push stream, container logs).

Two layers, as docker-py itself has: the low-level ``APIClient`` (``engine.api``)
for the streaming build, push and pull, and the high-level ``DockerClient``
(``engine.client``) for containers.  The engine on our machines is Debian's
docker.io 20.10 while the SDK is 7.x, so the API version is always negotiated
(``version="auto"``).  Builds use the classic builder (what the ``/build``
endpoint speaks): templates must stay free of BuildKit-only syntax.

API::

    engine = Engine.connect(docker_host=None)   # None: $DOCKER_HOST or the local socket
                                                # ssh://user@host works (uses the ssh client)
    built = engine.build(context_dir, dockerfile="Dockerfile", tag="x:1", labels={...},
                         buildargs={...}, target=None, on_line=print)
    built.id, built.log, built.steps, built.cached, built.cached_steps, built.step_was_cached("aiter")
    engine.image(ref) -> ImageInfo | None        # id, tags, digests, labels, created
    engine.images_with_label(key, value) -> list[ImageInfo]
    engine.tag(image, repo, tag); engine.remove_image(ref, force=False, missing_ok=True)
    with engine.run(image, ["cmd", ...], environment={...}, devices=[...], labels={...}) as c:
        c.wait(timeout=60); c.logs(); c.status(); c.exit_code(); c.exec(["ls"]) -> (code, out)
    # the container is removed when the block exits, also on KeyboardInterrupt
    digest = engine.push("127.0.0.1:5000/atom", "v1", auth_config={"username": u, "password": p})
    info = engine.pull("127.0.0.1:5000/atom@sha256:...", auth_config=...)
    format_run_command(image, cmd, environment=..., inherit_env=False, remove=False, **run_options) -> str
    created_layers(build_log) -> list[str]   # images a (failed) build left behind, not FROM/cache

Errors: InfraError when the engine (or a registry, seen from the engine) cannot be reached;
BuildError for a failed build (message names ``Step N/M : ...``, evidence = log + failing step's
tail); TagError when a registry refuses a push/pull or a tag is missing.  Every build label adds
one ``LABEL`` step to the classic builder's output (and is counted in ``cached`` when cached).

Secrets: environment values given to ``run`` are never logged; ``format_run_command``
renders the equivalent ``docker run`` line with every ``--env`` value masked.
Registry credentials never appear in an error message or its evidence.
"""

from __future__ import annotations

import codecs
import contextlib
import datetime as _dt
import os
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict, Unpack, cast, overload

import docker
import docker.errors
import requests

from pipeline.errors import BuildError, InfraError, PipelineError, TagError

if TYPE_CHECKING:
    from pipeline.log import Logger

MASK = "***"

_START_HINT = (
    "Start the engine (as root: `dockerd >/var/log/dockerd.log 2>&1 &`, or `make setup`, which starts it "
    "and waits for it), or point DOCKER_HOST / --docker-host at a reachable engine "
    "(unix:///var/run/docker.sock, tcp://host:2376, ssh://user@host)."
)

_STEP_RE = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_DIGEST_RE = re.compile(r"digest: (sha256:[0-9a-f]{64})")
_AUTH_WORDS = ("unauthorized", "authentication required", "denied", "no basic auth credentials", "forbidden")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: list[str]
    digests: list[str]
    labels: dict[str, str]
    created: str  # ISO 8601, as the engine reports it

    @classmethod
    def from_inspect(cls, data: Mapping[str, Any]) -> ImageInfo:
        config = data.get("Config") or {}
        return cls(
            id=str(data["Id"]),
            tags=list(data.get("RepoTags") or []),
            digests=list(data.get("RepoDigests") or []),
            labels=dict(config.get("Labels") or {}),
            created=str(data.get("Created", "")),
        )


@dataclass(frozen=True)
class ContainerInfo:
    """What the engine says about one container (any state)."""

    id: str
    name: str
    image_id: str  # the image the container was created from (sha256:...)
    status: str  # created / running / exited / ...
    labels: dict[str, str]
    network_mode: str
    pid: int  # its init process on the engine's host (0 when not running)

    @classmethod
    def from_inspect(cls, data: Mapping[str, Any]) -> ContainerInfo:
        state = data.get("State") or {}
        return cls(
            id=str(data["Id"]),
            name=str(data.get("Name", "")).lstrip("/"),
            image_id=str(data.get("Image", "")),
            status=str(state.get("Status", "")),
            labels=dict((data.get("Config") or {}).get("Labels") or {}),
            network_mode=str((data.get("HostConfig") or {}).get("NetworkMode", "")),
            pid=int(state.get("Pid") or 0),
        )


@dataclass(frozen=True)
class BuiltImage:
    """A successful build: image id, full log, the ``Step N/M : ...`` headers in order,
    and which of those steps the engine took from its cache."""

    id: str
    log: str
    steps: list[str]
    cached: list[str] = field(default_factory=list)

    @property
    def cached_steps(self) -> int:
        return len(self.cached)

    def step_was_cached(self, needle: str) -> bool:
        """True if every step whose header contains ``needle`` came from the cache (and one exists)."""
        matching = [s for s in self.steps if needle in s]
        return bool(matching) and all(s in self.cached for s in matching)


class _BuildLog:
    """Accumulates the classic builder's stream into lines, steps and cache hits."""

    def __init__(self, on_line: Callable[[str], None] | None) -> None:
        self.on_line = on_line
        self.lines: list[str] = []
        self.steps: list[str] = []
        self.cached: list[str] = []
        self.step_start: dict[str, int] = {}
        self._partial = ""

    def feed(self, text: str) -> None:
        text = self._partial + text
        *complete, self._partial = text.split("\n")
        for line in complete:
            self._line(line.rstrip("\r"))

    def flush(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""

    def _line(self, line: str) -> None:
        self.lines.append(line)
        if _STEP_RE.match(line):
            self.steps.append(line)
            self.step_start[line] = len(self.lines) - 1
        elif line.strip() == "---> Using cache" and self.steps:
            self.cached.append(self.steps[-1])
        if self.on_line is not None:
            self.on_line(line)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def current_step_output(self, limit: int = 40) -> str:
        if not self.steps:
            return "\n".join(self.lines[-limit:])
        start = self.step_start[self.steps[-1]]
        return "\n".join(self.lines[start:][-limit:])


# --------------------------------------------------------------------------- errors


_ssh_pool_patched = False


def _drop_dead_ssh_connections() -> None:
    """Make the SDK's ssh:// transport survive `ssh` processes that have exited.

    docker-py's SSHConnectionPool hands out pooled connections without checking them (its
    fake socket hides the dead `ssh ... dial-stdio` pipe from urllib3), and the engine closes
    the one an exec used: the next request on it fails with a broken pipe. Once per process.
    """
    global _ssh_pool_patched
    if _ssh_pool_patched:
        return
    from docker.transport import sshconn

    original = sshconn.SSHConnectionPool._get_conn

    def _get_conn(self: Any, timeout: Any) -> Any:
        for _ in range(self.pool.qsize() + 1 if self.pool is not None else 1):
            conn = original(self, timeout)
            proc = getattr(getattr(conn, "sock", None), "proc", None)
            if proc is None or proc.poll() is None:
                return conn
            conn.close()  # its ssh exited: never reuse it
        return self._new_conn()

    sshconn.SSHConnectionPool._get_conn = _get_conn

    # Closing a connection writes to its ssh's stdin; after the engine ended an exec's stream
    # that ssh has exited, and the write's broken pipe failed a command that had succeeded.
    close = sshconn.SSHSocket.close

    def _close(self: Any) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            return
        with contextlib.suppress(BrokenPipeError):
            close(self)

    sshconn.SSHSocket.close = _close
    _ssh_pool_patched = True


def _broken_pipe(exc: BaseException) -> bool:
    return "Broken pipe" in str(exc)


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, docker.errors.APIError):
        return False  # the engine answered (the error may be about a registry it could not reach)
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        return True
    text = str(exc)
    return any(
        s in text
        for s in ("Connection refused", "Connection aborted", "Error while fetching server API version")
    )


@contextlib.contextmanager
def _translated(
    action: str, error: type[PipelineError] = InfraError, secrets: Sequence[str] = ()
) -> Iterator[None]:
    """Turn docker/requests errors raised in the block into ``error`` (InfraError if the engine is gone)."""
    try:
        yield
    except PipelineError:
        raise
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        text = _scrub(f"{type(exc).__name__}: {exc}", secrets)
        if _is_connection_error(exc) or isinstance(exc, requests.exceptions.Timeout):
            raise InfraError(
                f"The Docker engine did not answer while trying to {action}: {text}",
                hint=_START_HINT,
                evidence=text,
            ) from None
        raise error(f"Docker could not {action}: {text}", evidence=text) from None


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, MASK)
    return text


def _auth_secrets(auth_config: Mapping[str, str] | None) -> list[str]:
    if not auth_config:
        return []
    return [
        v for k, v in auth_config.items() if k in ("password", "identitytoken", "registrytoken", "auth") and v
    ]


_RUN_FLAGS = {
    "name": "--name",
    "devices": "--device",
    "group_add": "--group-add",
    "ipc_mode": "--ipc",
    "cap_add": "--cap-add",
    "security_opt": "--security-opt",
    "network_mode": "--network",
    "volumes": "--volume",
    "ports": "--publish",
    "labels": "--label",
    "shm_size": "--shm-size",
    "pid_mode": "--pid",
}


def format_run_command(
    image: str,
    command: Sequence[str] | str | None = None,
    *,
    environment: Mapping[str, str] | None = None,
    inherit_env: bool = False,
    remove: bool = False,
    **options: Any,
) -> str:
    """The ``docker run`` line equivalent to ``Engine.run(...)`` (same keyword names), for logs and for
    people to copy.  Environment values never appear: ``--env KEY=***``, or with ``inherit_env=True``
    ``--env KEY``, which makes the docker CLI take the value from the caller's environment."""
    parts = ["docker", "run"]
    if remove:
        parts.append("--rm")
    for key, value in (environment or {}).items():
        parts += ["--env", key if inherit_env or value is None else f"{key}={MASK}"]
    for key, value in options.items():
        if value in (None, False, [], {}, ""):
            continue
        flag = _RUN_FLAGS.get(key, "--" + key.replace("_", "-"))
        if key == "volumes" and isinstance(value, Mapping):
            for host, spec in value.items():
                bind = f"{host}:{spec['bind']}" if isinstance(spec, Mapping) else f"{host}:{spec}"
                mode = spec.get("mode") if isinstance(spec, Mapping) else None
                parts += [flag, f"{bind}:{mode}" if mode else bind]
        elif key == "ports" and isinstance(value, Mapping):
            parts += [
                x for cport, hport in value.items() for x in (flag, f"{hport}:{cport}" if hport else cport)
            ]
        elif isinstance(value, Mapping):
            parts += [x for k, v in value.items() for x in (flag, f"{k}={v}")]
        elif isinstance(value, list | tuple):
            parts += [x for v in value for x in (flag, str(v))]
        elif value is True:
            parts.append(flag)
        else:
            parts += [flag, str(value)]
    parts.append(image)
    if isinstance(command, str):
        parts.append(command)
    elif command:
        parts += list(command)
    return shlex.join(parts)


# --------------------------------------------------------------------------- protocols


class BuildOptions(TypedDict, total=False):
    """The keywords of `build` (`EngineAPI` and `Engine`): `dockerfile` (default "Dockerfile") in the
    context, the image's `tag`, `labels` and `buildargs`, the stage to stop at (`target`), `nocache`,
    `pull` (the base again), and `on_line`, which is given each output line as it comes."""

    dockerfile: str
    tag: str | None
    labels: Mapping[str, str] | None
    buildargs: Mapping[str, str] | None
    target: str | None
    nocache: bool
    pull: bool
    on_line: Callable[[str], None] | None


class RunOptions(TypedDict, total=False):
    """The keywords of `run` (`EngineAPI` and `Engine`), named as `format_run_command` prints them.

    Each absent, None or empty one is left to the engine; `detach` is True unless given.
    """

    name: str | None
    environment: Mapping[str, str] | None
    devices: Sequence[str] | None
    group_add: Sequence[str] | None
    ipc_mode: str | None
    cap_add: Sequence[str] | None
    security_opt: Sequence[str] | None
    network_mode: str | None
    volumes: Mapping[str, Mapping[str, str]] | Sequence[str] | None
    ports: Mapping[str, int | str | None] | None
    labels: Mapping[str, str] | None
    shm_size: str | None
    pid_mode: str | None
    read_only: bool
    detach: bool


class ContainerAPI(Protocol):
    """What the stages use of a running container (`ContainerHandle`; fakes in the unit tier)."""

    id: str
    name: str

    def __enter__(self) -> ContainerAPI: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
    @overload
    def logs(self, *, stream: Literal[False] = False, follow: bool = False) -> str: ...
    @overload
    def logs(self, *, stream: Literal[True], follow: bool = True) -> Iterator[str]: ...
    def exec(
        self,
        cmd: Sequence[str] | str,
        *,
        environment: Mapping[str, str] | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> tuple[int, str]: ...
    def exit_code(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def info(self) -> ContainerInfo: ...
    def remove(self) -> None: ...


class EngineAPI(Protocol):
    """The one engine interface the stages take: imagebuild, selfcheck, smoke, tag and the
    orchestrator's Context (`Engine` implements it; the unit tier passes fakes)."""

    docker_host: str | None

    def close(self) -> None: ...
    def version(self) -> dict[str, Any]: ...
    def build(
        self,
        context_dir: str | Path,
        **options: Unpack[BuildOptions],
    ) -> BuiltImage: ...
    def images_with_label(self, key: str, value: str | None = None) -> list[ImageInfo]: ...
    def pull(self, ref: str, auth_config: Mapping[str, str] | None = None) -> ImageInfo: ...
    def archive(self, container: str, path: str) -> bytes: ...
    def image(self, ref: str) -> ImageInfo | None: ...
    def tag(self, image: str, repo: str, tag: str) -> None: ...
    def remove_image(
        self, ref: str, *, force: bool = False, noprune: bool = False, missing_ok: bool = True
    ) -> None: ...
    def push(self, repo: str, tag: str, auth_config: Mapping[str, str] | None = None) -> str: ...
    def run(
        self,
        image: str,
        command: Sequence[str] | str | None = None,
        **options: Unpack[RunOptions],
    ) -> ContainerAPI: ...
    def containers(self, key: str, value: str | None = None) -> list[ContainerInfo]: ...
    def container(self, ref: str) -> ContainerInfo | None: ...
    def running_containers(self) -> list[ContainerInfo]: ...
    def remove_container(self, ref: str, *, name: str | None = None, timeout: float = 60.0) -> None: ...


# --------------------------------------------------------------------------- containers


class ContainerHandle:
    """A created-and-started container.  As a context manager it is always removed on exit."""

    def __init__(self, engine: Engine, container: Any) -> None:
        self._engine = engine
        self._c = container
        self.id: str = str(container.id)
        self.name: str = str(container.name)

    def __repr__(self) -> str:  # never the environment
        return f"ContainerHandle({self.name!r}, id={self.id[:12]!r})"

    def __enter__(self) -> ContainerHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    @overload
    def logs(self, *, stream: Literal[False] = False, follow: bool = False) -> str: ...
    @overload
    def logs(self, *, stream: Literal[True], follow: bool = True) -> Iterator[str]: ...

    def logs(self, *, stream: bool = False, follow: bool = False) -> str | Iterator[str]:
        """stdout+stderr so far (``stream=False``) or an iterator of decoded chunks as they come."""
        if stream:
            return self._stream_logs(follow)
        with _translated(f"read the logs of container {self.name}"):
            return cast(bytes, self._c.logs(stdout=True, stderr=True)).decode("utf-8", "replace")

    def _stream_logs(self, follow: bool) -> Iterator[str]:
        with _translated(f"stream the logs of container {self.name}"):
            for chunk in self._c.logs(stdout=True, stderr=True, stream=True, follow=follow):
                yield cast(bytes, chunk).decode("utf-8", "replace")

    def status(self) -> str:
        """created / running / exited / ... (``removed`` once gone)."""
        with _translated(f"inspect container {self.name}"):
            try:
                self._c.reload()
            except docker.errors.NotFound:
                return "removed"
        return str(self._c.status)

    def info(self) -> ContainerInfo:
        """The engine's view of this container (image ID, state, labels)."""
        with _translated(f"inspect container {self.name}"):
            return ContainerInfo.from_inspect(self._engine.api.inspect_container(self.id))

    def exit_code(self) -> int | None:
        """The exit code once the container stopped, else None."""
        with _translated(f"inspect container {self.name}"):
            state = self._engine.api.inspect_container(self.id)["State"]
        if state.get("Running") or state.get("Status") in ("created", "running", "restarting"):
            return None
        return int(state["ExitCode"])

    def wait(self, timeout: float | None = None) -> int:
        """Block until the container exits; its exit code.  InfraError on timeout."""
        try:
            with _translated(f"wait for container {self.name}"):
                result = self._c.wait(timeout=timeout)
        except InfraError as err:
            raise InfraError(
                f"Container {self.name} did not exit within {timeout} s.", evidence=self._tail_logs()
            ) from err
        return int(result["StatusCode"])

    def _tail_logs(self) -> str:
        try:
            return "\n".join(self.logs().splitlines()[-50:])
        except PipelineError:
            return ""

    def exec(
        self,
        cmd: Sequence[str] | str,
        *,
        environment: Mapping[str, str] | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> tuple[int, str]:
        """Run `cmd` in the container; (exit code, stdout+stderr). With `on_output`, each piece
        of output is also handed to it as it comes (a long-running tool watched live)."""
        from pipeline.retry import GaveUp, with_retries

        # Over ssh:// the SDK pools `ssh ... dial-stdio` processes and cannot see that one died
        # while idle (the engine closed it during a long lm_eval run): the next request on it
        # fails with a broken pipe. Create and inspect are safe to repeat; start is repeated
        # only when the engine says the command never started.
        api, env = self._c.client.api, dict(environment or {})
        what = f"run a command in container {self.name}"

        def again(call: Callable[[], Any]) -> Any:
            def attempt() -> Any:
                with _translated(what):
                    return call()

            try:
                return with_retries(attempt, retries=1, backoff=0.2, transient=_broken_pipe)
            except GaveUp as e:
                raise e.error from None

        exec_id = again(
            lambda: api.exec_create(self.id, cmd, stdout=True, stderr=True, environment=env)["Id"]
        )
        if on_output is not None:
            with _translated(what):
                decoder = codecs.getincrementaldecoder("utf-8")("replace")
                pieces: list[str] = []
                for chunk in api.exec_start(exec_id, stream=True):
                    text = decoder.decode(chunk)
                    if text:
                        pieces.append(text)
                        on_output(text)
                pieces.append(decoder.decode(b"", final=True))
            code = again(lambda: api.exec_inspect(exec_id)["ExitCode"])
            return int(code if code is not None else -1), "".join(pieces)
        try:
            with _translated(what):
                out = api.exec_start(exec_id)
        except InfraError as e:
            state = again(lambda: api.exec_inspect(exec_id))
            started = state.get("Running") or state.get("Pid") or state.get("ExitCode") is not None
            if started or not _broken_pipe(e):
                raise
            with _translated(what):
                out = api.exec_start(exec_id)
        code = again(lambda: api.exec_inspect(exec_id)["ExitCode"])
        return int(code if code is not None else -1), cast(bytes, out).decode("utf-8", "replace")

    def stop(self, timeout: int = 10) -> None:
        with _translated(f"stop container {self.name}"), contextlib.suppress(docker.errors.NotFound):
            self._c.stop(timeout=timeout)

    def remove(self) -> None:
        """Force-remove (kills if running).  Idempotent; see `Engine.remove_container`."""
        self._engine.remove_container(self.id, name=self.name)


# --------------------------------------------------------------------------- engine


class Engine:
    """One connection to one Docker engine."""

    def __init__(self, client: Any, docker_host: str | None, log: Logger | None = None) -> None:
        self.client = client
        self.api = client.api
        self.docker_host = docker_host
        self.log = log  # the run's Logger (None: quiet)

    def __repr__(self) -> str:
        return f"Engine({self.docker_host or 'default'!r})"

    @classmethod
    def connect(
        cls,
        docker_host: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        timeout: int = 120,
        log: Logger | None = None,
    ) -> Engine:
        """Connect to ``docker_host`` (None: ``DOCKER_HOST`` in ``env``, default os.environ, else the socket).

        Raises InfraError, saying how to start dockerd, when nothing answers.
        """
        env = os.environ if env is None else env
        host = docker_host or env.get("DOCKER_HOST") or None
        where = host or "the local socket (unix:///var/run/docker.sock)"
        try:
            kwargs: dict[str, Any] = docker.utils.kwargs_from_env(environment=dict(env))
            if docker_host:
                kwargs["base_url"] = docker_host
            if str(kwargs.get("base_url") or "").startswith("ssh://"):
                _drop_dead_ssh_connections()
            client = docker.DockerClient(version="auto", timeout=timeout, use_ssh_client=True, **kwargs)
            client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
            raise InfraError(
                f"No Docker engine answers at {where} ({type(exc).__name__}: {exc}).",
                hint=_START_HINT,
                evidence=str(exc),
            ) from None
        return cls(client, host, log)

    def close(self) -> None:
        self.client.close()

    def version(self) -> dict[str, Any]:
        with _translated("read the engine version"):
            return cast(dict[str, Any], self.api.version())

    # ------------------------------------------------------------------ images

    def build(
        self,
        context_dir: str | Path,
        **options: Unpack[BuildOptions],
    ) -> BuiltImage:
        """Build with the classic builder, streaming each output line to ``on_line``.

        Raises BuildError naming the failing ``Step N/M : ...``; its evidence is the full log
        followed by the last lines of that step's output.
        """
        unknown = options.keys() - BuildOptions.__optional_keys__
        if unknown:  # as a keyword-only signature would
            raise TypeError(f"Engine.build() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
        dockerfile, tag = options.get("dockerfile", "Dockerfile"), options.get("tag")
        labels, buildargs = options.get("labels"), options.get("buildargs")
        context = Path(context_dir)
        if not (context / dockerfile).is_file():
            raise BuildError(
                f"No {dockerfile} in the build context {context}.",
                hint="Render the build context first (`pipeline render`).",
            )
        blog = _BuildLog(options.get("on_line"))
        image_id: str | None = None
        error: str | None = None
        try:
            with _translated(f"build {tag or context}", BuildError):
                stream = self.api.build(
                    path=str(context),
                    dockerfile=dockerfile,
                    tag=tag,
                    labels=dict(labels) if labels else None,
                    buildargs=dict(buildargs) if buildargs else None,
                    target=options.get("target"),
                    nocache=options.get("nocache", False),
                    pull=options.get("pull", False),
                    rm=True,
                    forcerm=True,
                    decode=True,
                )
                for item in stream:
                    if "stream" in item:
                        blog.feed(str(item["stream"]))
                    if "aux" in item and isinstance(item["aux"], dict) and "ID" in item["aux"]:
                        image_id = str(item["aux"]["ID"])
                    if (said := _stream_error(item)) is not None:
                        error = said
                        blog.feed("ERROR: " + error + "\n")
        except BuildError as err:
            blog.flush()
            raise self._build_error(blog, tag, err.message) from None
        blog.flush()
        if error is not None:
            raise self._build_error(blog, tag, error)
        if image_id is None:
            found = re.findall(r"^Successfully built ([0-9a-f]+)$", blog.text, re.M)
            if not found:
                raise self._build_error(blog, tag, "the engine did not report an image id")
            image_id = found[-1]
        return BuiltImage(id=image_id, log=blog.text, steps=list(blog.steps), cached=list(blog.cached))

    @staticmethod
    def _build_error(blog: _BuildLog, tag: str | None, reason: str) -> BuildError:
        step = blog.steps[-1] if blog.steps else "before the first step"
        tail = blog.current_step_output()
        return BuildError(
            f"The image build{f' of {tag}' if tag else ''} failed at {step}: {reason.strip()}",
            hint="The full build log is in the run directory; the end of the failing step is shown above.",
            evidence=f"{blog.text}\n\n--- last lines of the failing step ---\n{tail}",
        )

    def image(self, ref: str) -> ImageInfo | None:
        with _translated(f"inspect image {ref}"):
            try:
                return ImageInfo.from_inspect(self.api.inspect_image(ref))
            except docker.errors.NotFound:
                return None

    def archive(self, container: str, path: str) -> bytes:
        """The tar archive of ``path`` in ``container`` (as `docker cp CONTAINER:PATH -` gives it)."""
        with _translated(f"copy {path} out of container {container[:12]}"):
            stream, _ = self.api.get_archive(container, path)
            return b"".join(stream)

    def images_with_label(self, key: str, value: str | None = None) -> list[ImageInfo]:
        label = key if value is None else f"{key}={value}"
        with _translated(f"list images labelled {label}"):
            summaries = self.api.images(filters={"label": label})
        found = [self.image(str(s["Id"])) for s in summaries]
        return [i for i in found if i is not None]

    def containers_with_label(self, key: str, value: str | None = None) -> list[str]:
        """Ids of all containers (any state) carrying the label."""
        label = key if value is None else f"{key}={value}"
        with _translated(f"list containers labelled {label}"):
            return [str(c["Id"]) for c in self.api.containers(all=True, filters={"label": label})]

    def containers(self, key: str, value: str | None = None) -> list[ContainerInfo]:
        """All containers (any state) carrying the label, inspected."""
        out = []
        for cid in self.containers_with_label(key, value):
            info = self.container(cid)
            if info is not None:
                out.append(info)
        return out

    def container(self, ref: str) -> ContainerInfo | None:
        with _translated(f"inspect container {ref[:12]}"):
            try:
                return ContainerInfo.from_inspect(self.api.inspect_container(ref))
            except docker.errors.NotFound:
                return None

    def running_containers(self) -> list[ContainerInfo]:
        """Every running container on the engine (to name the holder of a port)."""
        with _translated("list running containers"):
            ids = [str(c["Id"]) for c in self.api.containers()]
        return [i for i in (self.container(c) for c in ids) if i is not None]

    def remove_container(self, ref: str, *, name: str | None = None, timeout: float = 60.0) -> None:
        """Force-remove (kills if running); idempotent.

        A removal already in progress (HTTP 409, e.g. a second Ctrl-C retrying it) is waited for,
        not reported as a failure: the container is gone when this returns.
        """
        what = name or ref[:12]
        deadline = time.monotonic() + timeout
        while True:
            with _translated(f"remove container {what}"):
                try:
                    self.api.remove_container(ref, force=True, v=True)
                    return
                except docker.errors.NotFound:
                    return
                except docker.errors.APIError as exc:
                    if exc.status_code != 409 or time.monotonic() > deadline:
                        raise
            if self.container(ref) is None:
                return
            time.sleep(0.1)

    def tag(self, image: str, repo: str, tag: str) -> None:
        with _translated(f"tag {image} as {repo}:{tag}", TagError):
            ok = self.api.tag(image, repo, tag, force=True)
        if not ok:
            raise TagError(f"The engine refused to tag {image} as {repo}:{tag}.")

    def remove_image(
        self, ref: str, *, force: bool = False, missing_ok: bool = True, noprune: bool = False
    ) -> None:
        """``noprune=True`` keeps untagged parents (the classic builder's cache)."""
        with _translated(f"remove image {ref}"):
            try:
                self.api.remove_image(ref, force=force, noprune=noprune)
            except docker.errors.NotFound:
                if not missing_ok:
                    raise

    # ------------------------------------------------------------------ registry

    def push(self, repo: str, tag: str, auth_config: Mapping[str, str] | None = None) -> str:
        """Push ``repo:tag``; the pushed manifest digest (``sha256:...``).

        TagError when the registry refuses (bad credentials, denied, ...), InfraError when it or
        the engine cannot be reached.  Credentials never appear in a message or its evidence.
        """
        secrets = _auth_secrets(auth_config)
        ref = f"{repo}:{tag}"
        lines: list[str] = []
        digest: str | None = None
        error: str | None = None
        with _translated(f"push {ref}", TagError, secrets), self._registry_api_errors("push", ref, secrets):
            for item in self.api.push(
                repo,
                tag=tag,
                auth_config=dict(auth_config) if auth_config else None,
                stream=True,
                decode=True,
            ):
                status = item.get("status")
                if status:
                    lines.append(f"{item.get('id', '')}: {status}" if item.get("id") else str(status))
                    m = _DIGEST_RE.search(str(status))
                    if m:
                        digest = m.group(1)
                aux = item.get("aux")
                if isinstance(aux, dict) and aux.get("Digest"):
                    digest = str(aux["Digest"])
                if (said := _stream_error(item)) is not None:
                    error = said
                    lines.append("ERROR: " + error)
        evidence = _scrub("\n".join(lines), secrets)
        if error is not None:
            raise self._registry_error("push", ref, _scrub(error, secrets), evidence)
        if digest is None:
            raise TagError(f"Pushing {ref} finished without a digest from the registry.", evidence=evidence)
        return digest

    def pull(self, ref: str, auth_config: Mapping[str, str] | None = None) -> ImageInfo:
        """Pull ``repo:tag`` or ``repo@sha256:...``; the local image."""
        secrets = _auth_secrets(auth_config)
        lines: list[str] = []
        error: str | None = None
        with _translated(f"pull {ref}", TagError, secrets), self._registry_api_errors("pull", ref, secrets):
            for item in self.api.pull(
                ref, auth_config=dict(auth_config) if auth_config else None, stream=True, decode=True
            ):
                if item.get("status"):
                    lines.append(str(item["status"]))
                if (said := _stream_error(item)) is not None:
                    error = said
                    lines.append("ERROR: " + error)
        evidence = _scrub("\n".join(lines), secrets)
        if error is not None:
            raise self._registry_error("pull", ref, _scrub(error, secrets), evidence)
        info = self.image(ref)
        if info is None:
            raise TagError(f"Pulled {ref} but the engine does not show it.", evidence=evidence)
        return info

    @contextlib.contextmanager
    def _registry_api_errors(self, action: str, ref: str, secrets: Sequence[str]) -> Iterator[None]:
        """The engine refused the request outright (HTTP error): classify what the registry said."""
        try:
            yield
        except docker.errors.APIError as exc:
            text = _scrub(str(exc.explanation or exc), secrets)
            raise self._registry_error(action, ref, text, _scrub(str(exc), secrets)) from None

    @staticmethod
    def _registry_error(action: str, ref: str, error: str, evidence: str) -> PipelineError:
        low = error.lower()
        if any(w in low for w in _AUTH_WORDS):
            return TagError(
                f"The registry refused to let us {action} {ref}: {error}",
                hint="Check the registry credentials (not shown here) and the repository permissions.",
                evidence=evidence,
            )
        if any(
            w in low
            for w in (
                "connection refused",
                "no such host",
                "i/o timeout",
                "dial tcp",
                "server gave http response",
            )
        ):
            return InfraError(
                f"The registry for {ref} could not be reached to {action}: {error}",
                hint="Check that the registry is up and reachable from the Docker engine itself.",
                evidence=evidence,
            )
        return TagError(f"Could not {action} {ref}: {error}", evidence=evidence)

    # ------------------------------------------------------------------ containers

    def run(
        self,
        image: str,
        command: Sequence[str] | str | None = None,
        **options: Unpack[RunOptions],
    ) -> ContainerHandle:
        """Create and start a container; the handle (use it as a context manager to always remove it).

        With ``detach=False`` the call also waits for the container to exit.  If the start fails the
        container is removed before the error is raised.
        """
        unknown = options.keys() - RunOptions.__optional_keys__
        if unknown:  # as a keyword-only signature would
            raise TypeError(f"Engine.run() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
        environment = options.get("environment")
        create: dict[str, Any] = {
            "name": options.get("name"),
            "devices": _listed(options.get("devices")),
            "group_add": _listed(options.get("group_add")),
            "ipc_mode": options.get("ipc_mode"),
            "cap_add": _listed(options.get("cap_add")),
            "security_opt": _listed(options.get("security_opt")),
            "network_mode": options.get("network_mode"),
            "volumes": options.get("volumes") or None,
            "ports": _mapped(options.get("ports")),
            "labels": _mapped(options.get("labels")),
            "shm_size": options.get("shm_size"),
            "pid_mode": options.get("pid_mode"),
            "read_only": options.get("read_only") or None,
        }
        create = {k: v for k, v in create.items() if v is not None}
        if self.log is not None:
            self.log.debug(format_run_command(image, command, environment=environment, **create))
        secrets = [v for v in (environment or {}).values() if v]
        with _translated(f"create a container from {image}", secrets=secrets):
            container = self.client.containers.create(
                image, command, environment=dict(environment) if environment else None, **create
            )
        handle = ContainerHandle(self, container)
        try:
            with _translated(f"start container {handle.name} from {image}", secrets=secrets):
                container.start()
            if not options.get("detach", True):
                handle.wait()
        except BaseException:
            # a second Ctrl-C/SIGTERM while removing must not leave the container behind
            interrupted = False
            for _ in range(5):
                try:
                    handle.remove()
                    break
                except KeyboardInterrupt:
                    interrupted = True
            if interrupted:
                raise KeyboardInterrupt from None
            raise
        return handle


def _stream_error(item: Mapping[str, Any]) -> str | None:
    """The error an item of the engine's build, push or pull stream reports, if it reports one."""
    if "error" in item or "errorDetail" in item:
        detail = item.get("errorDetail") or {}
        return str(item.get("error") or detail.get("message") or item)
    return None


def _listed(values: Sequence[str] | None) -> list[str] | None:
    return list(values) if values else None


def _mapped(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return dict(values) if values else None


_LAYER_RE = re.compile(r"^---> ([0-9a-f]{12,64})$")


def created_layers(build_log: str) -> list[str]:
    """Short ids of the images a classic build created, from its log: not the FROM image, not cache hits.

    A failed build leaves these behind (they are the cache a retry resumes from); tests remove them.
    """
    out: list[str] = []
    from_step = cached = False
    for line in build_log.splitlines():
        step = _STEP_RE.match(line)
        if step:
            from_step = step.group(3).split(None, 1)[0].upper() == "FROM"
            cached = False
            continue
        text = line.strip()
        if text == "---> Using cache":
            cached = True
            continue
        m = _LAYER_RE.match(text)
        if m and not from_step and not cached:
            out.append(m.group(1))
    return out


def parse_created(created: str) -> _dt.datetime | None:
    """The engine's ``Created`` (RFC 3339 with nanoseconds) as an aware datetime, or None."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", created)
    if not m:
        return None
    frac = (m.group(2) or ".0")[:7]
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    return _dt.datetime.fromisoformat(f"{m.group(1)}{frac}{tz}")
