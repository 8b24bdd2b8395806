"""The stage Context: settings and engine come from what a stage's Inputs recorded."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import load_settings
from pipeline.log import Logger
from pipeline.stages import smoke
from pipeline.stages.base import Context

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "MiniMax-M3-MXFP4.yaml"


class _Engine:
    def __init__(self, host: str | None) -> None:
        self.docker_host = host
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def image(self, ref: str) -> None:
        return None  # no image here: the smoke test says so


def _ctx(tmp_path: Path, **env: str) -> Context:
    settings = load_settings(env=env, cwd=tmp_path)
    return Context(settings=settings, log=Logger(stream=io.StringIO()), env={}, work_dir=tmp_path)


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[_Engine]:
    from pipeline.oci import engine as dockerw

    opened: list[_Engine] = []

    def connect(host: str | None, **_: Any) -> _Engine:
        opened.append(_Engine(host))
        return opened[-1]

    monkeypatch.setattr(dockerw.Engine, "connect", staticmethod(connect))
    return opened


def test_settings_with_puts_the_inputs_values_back_and_leaves_the_context_alone(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    settings = ctx.settings_with(tag={"registry": "registry.example:5000"}, image={"repository": "a/b"})
    assert (settings.tag.registry, settings.image.repository) == ("registry.example:5000", "a/b")
    assert settings.smoke == ctx.settings.smoke
    assert ctx.settings.tag.registry != "registry.example:5000"


def test_engine_is_opened_once_per_host(tmp_path: Path, connects: list[_Engine]) -> None:
    ctx = _ctx(tmp_path, PIPELINE_DOCKER_HOST="ssh://configured")
    first = ctx.engine()
    assert ctx.engine() is first and first.docker_host == "ssh://configured"
    other = ctx.engine("ssh://gpu-host")
    assert other.docker_host == "ssh://gpu-host" and first.closed
    assert [e.docker_host for e in connects] == ["ssh://configured", "ssh://gpu-host"]


def test_smoke_stage_uses_the_engine_and_settings_its_inputs_record(
    tmp_path: Path, connects: list[_Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.smoke

    seen: dict[str, Any] = {}

    def run_smoke(engine: _Engine, **kw: Any) -> Any:
        seen["host"], seen["settings"] = engine.docker_host, kw["settings"]
        raise RuntimeError("stop here")

    monkeypatch.setattr(pipeline.smoke, "run_smoke", run_smoke)
    ctx = _ctx(tmp_path)
    inputs = smoke.Inputs(
        image="img",
        model="MiniMax-M3-MXFP4",
        recipe=RECIPE,
        out_dir=tmp_path / "smoke",
        run_all=True,
        docker_host="ssh://recorded",
    )
    with pytest.raises(RuntimeError, match="stop here"):
        smoke.run(ctx, inputs)
    assert seen["host"] == "ssh://recorded"
    assert seen["settings"].smoke.docker_host == "ssh://recorded"
    assert seen["settings"].smoke.run_all_checks is True
