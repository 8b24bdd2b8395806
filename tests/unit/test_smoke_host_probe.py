"""The listener probe on the engine's host: one `HostProbe` for the port check and the refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.errors import InfraError
from pipeline.smoke.identity import HostProbe, Owner, check_port_free, name_foreign_holders


class _Probe:
    def __init__(self, out: str) -> None:
        self.out = out

    def __enter__(self) -> _Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def logs(self) -> str:
        return self.out


class _Engine:
    docker_host = None

    def __init__(self, listeners: list[dict[str, Any]], holders: list[dict[str, Any]]) -> None:
        self.out = json.dumps({"listeners": listeners, "holders": holders})
        self.runs: list[dict[str, Any]] = []

    def run(self, image: str, command: list[str], **kw: Any) -> _Probe:
        self.runs.append({"image": image, "command": command, **kw})
        return _Probe(self.out)

    def running_containers(self) -> list[Any]:
        return []


def _host(engine: _Engine) -> HostProbe:
    return HostProbe(engine, "img:1", "python3", "PROBE", {"run": "r1"}, Owner.current())  # type: ignore[arg-type]


def test_a_free_port_passes_and_the_probe_runs_on_the_host_network() -> None:
    engine = _Engine([], [])
    check_port_free(_host(engine), 8000)
    (run,) = engine.runs
    assert run["image"] == "img:1" and run["command"] == ["python3", "-c", "PROBE", "listeners", "8000"]
    assert (run["network_mode"], run["pid_mode"], run["labels"]) == ("host", "host", {"run": "r1"})


def test_a_taken_port_is_refused_naming_the_holder_and_the_same_probe_names_it_later() -> None:
    engine = _Engine([{"address": "0.0.0.0:8000", "inode": 7}], [{"pid": 42, "cmdline": "vllm serve"}])
    with pytest.raises(InfraError, match=r"port 8000 .* held by process 42 \(`vllm serve`\)"):
        check_port_free(_host(engine), 8000)
    assert name_foreign_holders(_host(engine), 8000).startswith("process 42 (`vllm serve`)")
