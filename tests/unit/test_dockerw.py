"""pipeline.oci.engine without an engine: stream parsing, error mapping, secret masking; the unit guards."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
import requests

from pipeline.errors import BuildError, InfraError, TagError
from pipeline.oci.engine import Engine, created_layers, format_run_command, parse_created
from tests.conftest import ForbiddenInUnitTest

BUILD_OK = [
    {"stream": "Step 1/3 : FROM base:1\n"},
    {"stream": " ---> c6e6329a25b5\n"},
    {"stream": "Step 2/3 : RUN echo aiter"},  # a line split across chunks
    {"stream": " > /aiter\n"},
    {"stream": " ---> Using cache\n ---> 1111111111aa\n"},
    {"stream": "Step 3/3 : RUN echo atom\n"},
    {"stream": " ---> Running in 0123456789ab\n"},
    {"stream": "atom\n"},
    {"stream": "Removing intermediate container 0123456789ab\n ---> 2222222222bb\n"},
    {"aux": {"ID": "sha256:" + "2" * 64}},
    {"stream": "Successfully built 2222222222bb\n"},
]

BUILD_FAIL = [
    {"stream": "Step 1/3 : FROM base:1\n ---> c6e6329a25b5\n"},
    {"stream": "Step 2/3 : RUN echo first\n ---> Running in aaaaaaaaaaaa\nfirst\n"},
    {"stream": "Removing intermediate container aaaaaaaaaaaa\n ---> 3333333333cc\n"},
    {"stream": "Step 3/3 : RUN make && exit 2\n ---> Running in bbbbbbbbbbbb\n"},
    {"stream": "compiling\nerror: no rule\n"},
    {
        "errorDetail": {
            "code": 2,
            "message": "The command '/bin/sh -c make && exit 2' returned a non-zero code: 2",
        },
        "error": "The command '/bin/sh -c make && exit 2' returned a non-zero code: 2",
    },
]


class FakeAPI:
    def __init__(
        self,
        build: list[dict[str, Any]] | Exception | None = None,
        push: list[dict[str, Any]] | Exception | None = None,
    ) -> None:
        self._build = build
        self._push = push
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _stream(self, what: list[dict[str, Any]] | Exception | None) -> Iterator[dict[str, Any]]:
        if isinstance(what, Exception):
            raise what
        yield from what or []

    def build(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.calls.append(("build", kwargs))
        return self._stream(self._build)

    def push(self, repo: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.calls.append(("push", {"repo": repo, **kwargs}))
        return self._stream(self._push)


class FakeClient:
    def __init__(self, api: FakeAPI) -> None:
        self.api = api


def make_engine(**kwargs: Any) -> tuple[Engine, FakeAPI]:
    api = FakeAPI(**kwargs)
    return Engine(FakeClient(api), None), api


@pytest.fixture
def context(tmp_path: Path) -> Path:
    (tmp_path / "Dockerfile").write_text("FROM base:1\n")
    return tmp_path


def test_build_parses_steps_cache_hits_and_id(context: Path) -> None:
    engine, api = make_engine(build=BUILD_OK)
    lines: list[str] = []
    built = engine.build(context, tag="x:1", labels={"a": "b"}, on_line=lines.append)
    assert built.id == "sha256:" + "2" * 64
    assert built.steps == [
        "Step 1/3 : FROM base:1",
        "Step 2/3 : RUN echo aiter > /aiter",
        "Step 3/3 : RUN echo atom",
    ]
    assert built.cached == ["Step 2/3 : RUN echo aiter > /aiter"]
    assert built.cached_steps == 1
    assert built.step_was_cached("aiter") and not built.step_was_cached("atom")
    assert "atom" in lines and lines[-1] == "Successfully built 2222222222bb"
    kwargs = api.calls[0][1]
    assert kwargs["labels"] == {"a": "b"} and kwargs["tag"] == "x:1" and kwargs["decode"] is True
    assert created_layers(built.log) == ["2222222222bb"]


def test_build_failure_names_step_and_keeps_evidence(context: Path) -> None:
    engine, _ = make_engine(build=BUILD_FAIL)
    with pytest.raises(BuildError) as excinfo:
        engine.build(context, tag="x:1")
    err = excinfo.value
    assert err.message.startswith("The image build of x:1 failed at Step 3/3 : RUN make && exit 2:")
    assert "returned a non-zero code: 2" in err.message
    assert err.evidence is not None
    full, _, tail = err.evidence.partition("--- last lines of the failing step ---")
    assert "Step 1/3 : FROM base:1" in full and "first" in full
    assert "error: no rule" in tail and "Step 2/3" not in tail
    assert created_layers(err.evidence) == ["3333333333cc"]


def test_build_api_error_and_connection_error(context: Path) -> None:
    engine, _ = make_engine(
        build=docker.errors.APIError("500 Server Error: Cannot locate specified Dockerfile")
    )
    with pytest.raises(BuildError, match=r"before the first step.*Cannot locate"):
        engine.build(context)
    engine, _ = make_engine(build=requests.exceptions.ConnectionError("Connection refused"))
    with pytest.raises(InfraError) as excinfo:
        engine.build(context)
    assert "dockerd" in str(excinfo.value) and "DOCKER_HOST" in str(excinfo.value)


def test_build_without_dockerfile(tmp_path: Path) -> None:
    engine, api = make_engine(build=BUILD_OK)
    with pytest.raises(BuildError, match="No Dockerfile"):
        engine.build(tmp_path)
    assert api.calls == []


PUSH_OK = [
    {"status": "The push refers to repository [127.0.0.1:5000/atom]"},
    {"status": "Pushed", "id": "abc"},
    {"status": "v1: digest: sha256:" + "d" * 64 + " size: 528"},
    {"progressDetail": {}, "aux": {"Tag": "v1", "Digest": "sha256:" + "d" * 64, "Size": 528}},
]


def test_push_returns_digest_and_passes_auth() -> None:
    engine, api = make_engine(push=PUSH_OK)
    auth = {"username": "u", "password": "hunter2-secret"}
    assert engine.push("127.0.0.1:5000/atom", "v1", auth_config=auth) == "sha256:" + "d" * 64
    assert api.calls[0][1]["auth_config"] == auth and api.calls[0][1]["tag"] == "v1"


@pytest.mark.parametrize(
    ("message", "error_type"),
    [
        ("unauthorized: authentication required hunter2-secret", TagError),
        ("denied: requested access to the resource is denied", TagError),
        ("Get http://127.0.0.1:1/v2/: dial tcp 127.0.0.1:1: connect: connection refused", InfraError),
        ("tag does not exist: 127.0.0.1:5000/atom:v9", TagError),
    ],
)
def test_push_errors_are_mapped_and_never_carry_the_password(
    message: str, error_type: type[Exception]
) -> None:
    stream = [PUSH_OK[0], {"errorDetail": {"message": message}, "error": message}]
    engine, _ = make_engine(push=stream)
    with pytest.raises(error_type) as excinfo:
        engine.push("127.0.0.1:5000/atom", "v1", auth_config={"username": "u", "password": "hunter2-secret"})
    err = excinfo.value
    assert type(err) is error_type
    text = f"{err}\n{getattr(err, 'evidence', '')}"
    assert "hunter2-secret" not in text
    assert message.split(":")[0].split()[0] in text


def test_push_exception_is_scrubbed() -> None:
    engine, _ = make_engine(push=docker.errors.APIError("500: login with hunter2-secret failed"))
    with pytest.raises(TagError) as excinfo:
        engine.push("r/x", "v1", auth_config={"username": "u", "password": "hunter2-secret"})
    assert "hunter2-secret" not in f"{excinfo.value} {excinfo.value.evidence}"


def test_push_refused_by_the_engine_is_classified() -> None:
    refused = docker.errors.APIError(
        "500 Server Error",
        explanation='Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused',
    )
    engine, _ = make_engine(push=refused)
    with pytest.raises(InfraError, match="could not be reached to push"):
        engine.push("127.0.0.1:1/x", "v1")
    denied = docker.errors.APIError("500 Server Error", explanation="unauthorized: hunter2-secret is wrong")
    engine, _ = make_engine(push=denied)
    with pytest.raises(TagError, match="refused") as excinfo:
        engine.push("r/x", "v1", auth_config={"username": "u", "password": "hunter2-secret"})
    assert "hunter2-secret" not in f"{excinfo.value} {excinfo.value.evidence}"


def test_push_without_digest_is_an_error() -> None:
    engine, _ = make_engine(push=PUSH_OK[:2])
    with pytest.raises(TagError, match="without a digest"):
        engine.push("r/x", "v1")


def test_format_run_command_masks_environment_values() -> None:
    line = format_run_command(
        "rocm/atom:1",
        ["python", "-m", "atom.entrypoints.openai_server", "--model", "amd/MiniMax-M3-MXFP4"],
        environment={"HF_TOKEN": "hf_very_secret", "ATOM_FORCE_ATTN_TRITON": "1"},
        devices=["/dev/kfd", "/dev/dri"],
        group_add=["video"],
        ipc_mode="host",
        cap_add=["SYS_PTRACE"],
        security_opt=["seccomp=unconfined"],
        network_mode="host",
        volumes={"/root/.cache/huggingface": {"bind": "/root/.cache/huggingface", "mode": "rw"}},
        labels={"a": "b"},
        remove=True,
    )
    assert "hf_very_secret" not in line
    assert line == (
        "docker run --rm --env 'HF_TOKEN=***' --env 'ATOM_FORCE_ATTN_TRITON=***' --device /dev/kfd "
        "--device /dev/dri --group-add video --ipc host --cap-add SYS_PTRACE --security-opt "
        "seccomp=unconfined --network host --volume /root/.cache/huggingface:/root/.cache/huggingface:rw "
        "--label a=b rocm/atom:1 python -m atom.entrypoints.openai_server --model amd/MiniMax-M3-MXFP4"
    )
    inherited = format_run_command(
        "img", None, environment={"HF_TOKEN": "hf_very_secret"}, inherit_env=True, ports={"8000/tcp": 8000}
    )
    assert inherited == "docker run --env HF_TOKEN --publish 8000:8000/tcp img"


def test_created_layers_skips_from_and_cache_hits() -> None:
    log = "\n".join(
        [
            "Step 1/3 : FROM base",
            " ---> 000000000000",
            "Step 2/3 : RUN a",
            " ---> Using cache",
            " ---> 111111111111",
            "Step 3/3 : RUN b",
            " ---> Running in 999999999999",
            "out",
            "Removing intermediate container 999999999999",
            " ---> 222222222222",
        ]
    )
    assert created_layers(log) == ["222222222222"]


def test_parse_created() -> None:
    created = parse_created("2026-11-29T21:50:36.123456789Z")
    assert created is not None and created.year == 2026 and created.microsecond == 123456
    assert parse_created("yesterday") is None


# ---------------------------------------------------------------- the unit-tier guards (tests/conftest.py)


def test_unit_tier_forbids_subprocess() -> None:
    with pytest.raises(ForbiddenInUnitTest, match="forbidden in unit tests"):
        subprocess.run(["true"], check=False)
    with pytest.raises(ForbiddenInUnitTest):
        os.system("true")


def test_unit_tier_forbids_docker_clients() -> None:
    with pytest.raises(ForbiddenInUnitTest):
        docker.from_env()
    with pytest.raises(ForbiddenInUnitTest):
        docker.DockerClient(base_url="unix:///var/run/docker.sock")
    with pytest.raises(ForbiddenInUnitTest):
        docker.APIClient(base_url="unix:///var/run/docker.sock")
    with pytest.raises(ForbiddenInUnitTest):
        Engine.connect()


def test_unit_tier_forbids_network() -> None:
    with pytest.raises(ForbiddenInUnitTest), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.connect(("127.0.0.1", 9))


def test_unit_tier_gets_the_unit_marker(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("docker") is None
