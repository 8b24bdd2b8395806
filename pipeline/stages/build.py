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
    # the candidate by digest, what smoke and tag act on: `REPO@sha256:…` when it is in the
    # registry (pushed, or found and pulled there), else the image ID
    candidate: str = ""
    skipped: bool
    found_in: str = ""  # "local" or the registry reference, when nothing was built
    steps: int = 0
    cached_steps: int = 0
    aiter_cached: bool | None = None
    pushed: str = ""  # the registry reference the candidate was pushed to
    log: Path | None = None
    attestations: Path | None = None  # attestations.json: none from the front end, our build provenance

    def figure(self) -> str:
        shown = self.candidate or self.image[:19]
        if self.skipped:
            return f"exists ({self.found_in}): {shown}"
        return f"built {shown}, {self.cached_steps}/{self.steps} steps cached"


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


def by_digest(pushed: str, found_in: str, image_id: str) -> str:
    """`REPO@sha256:…` of the candidate in the registry (pushed, else found there), else the image ID."""
    from pipeline.oci.ref import parse_image_ref

    for where in (pushed, found_in):
        if "@sha256:" in where:
            ref = parse_image_ref(where)
            return f"{ref.name}@{ref.digest}"
    return image_id


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
        candidate=by_digest(out.pushed, out.found_in, out.image_id),
        skipped=out.skipped,
        found_in=out.found_in,
        steps=out.steps,
        cached_steps=out.cached_steps,
        aiter_cached=out.aiter_cached,
        pushed=out.pushed,
        log=out.log_path,
        attestations=out.attestations,
    )
