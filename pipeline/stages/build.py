"""build: the rendered context built by the Docker engine, as an untagged candidate.

Skipped when an image with the same inputs digest exists on the engine, or as the
candidate tag in the target registry ([tag] registry), which is then pulled so
smoke and tag get a real image. A freshly built candidate is pushed there (when
a registry is configured), so the next machine finds it instead of rebuilding.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pipeline.stages import render as render_stage
from pipeline.stages.base import Context, StageData, Upstream
from pipeline.stages.spec import BuildSpec

NAME = "build"
STOPS: tuple[type[Exception], ...] = ()


class Inputs(StageData):
    context: Path
    inputs_digest: str  # the context's (render.json); what "same inputs, same image" means
    tag: str | None = None  # default: the candidate tag the render chose
    nocache: bool = False
    registry: str = ""  # look the candidate up there, and push it there after a build
    repository: str = ""


class Outputs(StageData):
    image: str  # the image ID on the engine (never empty)
    ref: str  # the tag it carries (the candidate)
    skipped: bool
    found_in: str = ""  # "local" or the registry reference, when nothing was built
    steps: int = 0
    cached_steps: int = 0
    aiter_cached: bool | None = None
    pushed: str = ""  # the registry reference the candidate was pushed to
    log: Path | None = None
    attestations: Path | None = None  # attestations.json: none from the front end, our build provenance

    def figure(self) -> str:
        if self.skipped:
            return f"exists ({self.found_in}): {self.image[:19]}"
        return f"built {self.image[:19]}, {self.cached_steps}/{self.steps} steps cached"


def plan(ctx: Context, spec: BuildSpec, up: Upstream) -> Inputs:
    rendered = up.get("render", render_stage.Outputs)
    return Inputs(
        context=rendered.context,
        inputs_digest=rendered.inputs_digest,
        registry=ctx.settings.tag.registry,
        repository=ctx.settings.image.repository,
    )


def reads(ctx: Context, inputs: Inputs) -> Iterable[Path]:
    return []  # the context is named by its inputs digest (render.json refuses an edited Dockerfile)


def run(ctx: Context, inputs: Inputs) -> Outputs:
    from pipeline.image.build import build_image

    out = build_image(
        ctx.engine(),
        inputs.context,
        tag=inputs.tag,
        log=ctx.log,
        run_dir=ctx.work_dir,
        nocache=inputs.nocache,
        settings=ctx.settings_with(
            tag={"registry": inputs.registry},
            image={"repository": inputs.repository or ctx.settings.image.repository},
        ),
        env=ctx.env,
    )
    return Outputs(
        image=out.image_id,
        ref=out.image_ref,
        skipped=out.skipped,
        found_in=out.found_in,
        steps=out.steps,
        cached_steps=out.cached_steps,
        aiter_cached=out.aiter_cached,
        pushed=out.pushed,
        log=out.log_path,
        attestations=out.attestations,
    )
