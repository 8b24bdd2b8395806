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
    from pipeline.imagebuild import build_image, registry_lookup

    settings = ctx.settings_with(
        tag={"registry": inputs.registry},
        image={"repository": inputs.repository or ctx.settings.image.repository},
    )
    engine = ctx.engine()
    out = build_image(
        engine,
        inputs.context,
        tag=inputs.tag,
        log=ctx.log,
        run_dir=ctx.work_dir,
        remote_lookup=registry_lookup(settings, ctx.env, ctx.log),
        nocache=inputs.nocache,
        settings=settings,
        env=ctx.env,
    )
    image, pushed = out.image_id, ""
    if out.skipped and not image:
        image = _pull_found(ctx, out.found_in, out.image_ref)
    elif not out.skipped and inputs.registry:
        pushed = _push_candidate(ctx, inputs, out.image_ref)
    return Outputs(
        image=image,
        ref=out.image_ref,
        skipped=out.skipped,
        found_in=out.found_in,
        steps=out.steps,
        cached_steps=out.cached_steps,
        aiter_cached=out.aiter_cached,
        pushed=pushed,
        log=out.log_path,
        attestations=out.attestations,
    )


def _pull_found(ctx: Context, found: str, candidate: str) -> str:
    """The registry holds the candidate: pull it by digest and tag it locally as the candidate."""
    from pipeline.imagebuild import split_ref
    from pipeline.registry import credentials_for
    from pipeline.validate import image_reference

    ref = image_reference(found)
    creds = credentials_for(ref.registry, ctx.env)
    engine = ctx.engine()
    info = engine.pull(f"{ref.name}@{ref.digest}", auth_config=creds.auth_config if creds else None)
    repo, tag = split_ref(candidate)
    engine.tag(info.id, repo, tag)
    ctx.log.info(f"pulled {ref.name}@{ref.digest} as {candidate}: {info.id[:19]}")
    return info.id


def _push_candidate(ctx: Context, inputs: Inputs, candidate: str) -> str:
    """Push the candidate tag to the target registry: where `registry_lookup` looks on the next run."""
    from pipeline.errors import PipelineError, sentence
    from pipeline.imagebuild import split_ref
    from pipeline.registry import credentials_for

    registry = inputs.registry.rstrip("/")
    repo, tag = split_ref(candidate)
    target = f"{registry}/{inputs.repository}" if not repo.startswith(registry + "/") else repo
    creds = credentials_for(registry, ctx.env)
    engine = ctx.engine()
    try:
        if target != repo:
            engine.tag(candidate, target, tag)
        digest = engine.push(target, tag, auth_config=creds.auth_config if creds else None)
    except PipelineError as e:
        ctx.log.warn(
            f"could not push the candidate {target}:{tag}: {sentence(e.message)} The next run may rebuild it."
        )
        return ""
    ctx.log.detail(f"pushed candidate {target}:{tag}@{digest}")
    return f"{target}:{tag}@{digest}"
