"""tag: push an immutable tag for a verified image, read its digest back, then move the moving tags.

Only a passed verdict bound to this exact image, recipe and lock is tagged
(pipeline.release.tag). In a run, the model's released state is recorded afterwards
(`locks/<model>.toml` and `locks/<model>.released.json`, which `pipeline rebuild`
compares the next inputs digest with).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pipeline.config import TagSettings
from pipeline.stages import build as build_stage
from pipeline.stages import render as render_stage
from pipeline.stages import smoke as smoke_stage
from pipeline.stages.base import Context, StageData, Upstream
from pipeline.stages.spec import BuildSpec

NAME = "tag"
STOPS: tuple[type[Exception], ...] = ()


class Inputs(StageData):
    image: str
    verdict: Path  # verdict.json (or its directory); the record is written next to it
    lock: Path | None  # the lock the image was built from (default: the one the verdict names)
    recipe: Path | None
    registry: str | None  # None: [tag] registry
    repository: str | None = None  # None: [image] repository
    tag: TagSettings  # templates, moving tags, latest, cosign
    release: Path | None = None  # locks dir: record the model's released state there
    model: str = ""
    inputs_digest: str = ""  # the context's, for the released state
    allow_older: bool = False  # move the moving tags back onto an older image (said loudly)
    build_attestations: Path | None = None  # the build's attestations.json, linked from the record


class Outputs(StageData):
    ref: str  # registry/repository:immutable-tag
    digest: str
    pinned_ref: str
    moved: tuple[str, ...]
    record: Path
    pushed: bool
    attested: bool

    def figure(self) -> str:
        return self.ref


def released_state_path(locks_dir: Path, model: str) -> Path:
    return locks_dir / f"{model}.released.json"


def plan(ctx: Context, spec: BuildSpec, up: Upstream) -> Inputs:
    built = up.get("build", build_stage.Outputs)
    smoked = up.get("smoke", smoke_stage.Outputs)
    rendered = up.get("render", render_stage.Outputs)
    return Inputs(
        # by digest: the image smoke ran (resolved once, recorded), on whichever engine
        image=smoked.image or built.candidate or built.image,
        verdict=smoked.verdict,
        lock=ctx.work_dir / "lock.toml",
        recipe=spec.recipe_path,
        registry=spec.registry,
        tag=ctx.settings.tag,
        release=Path(ctx.settings.paths.locks_dir),
        model=spec.model,
        inputs_digest=rendered.inputs_digest,
        build_attestations=built.attestations,
    )


def reads(ctx: Context, inputs: Inputs) -> Iterable[Path]:
    return [p for p in (inputs.lock, inputs.recipe) if p is not None]


def _verify_lock(ctx: Context, inputs: Inputs) -> None:
    """The lock, verified where the mirrors are (`release.tag.check_binding` then binds it to the
    image's pair and to the verdict, before anything is pushed)."""
    from pipeline.stages.verify import verify_here

    assert inputs.lock is not None
    verify_here(ctx, inputs.lock, lock_given=inputs.release is None, stage="tag")


def run(ctx: Context, inputs: Inputs) -> Outputs:
    from pipeline.errors import UsageError
    from pipeline.fsutil import atomic_write_json
    from pipeline.lock import Lock
    from pipeline.release.tag import tag_verified
    from pipeline.validate import check_tag_templates

    settings = ctx.settings.model_copy(update={"tag": inputs.tag})
    check_tag_templates(settings)
    registry = inputs.registry if inputs.registry is not None else settings.tag.registry
    if not registry:
        raise UsageError(
            "no registry is configured for the tag stage: nothing is released without one (the image "
            "stays a local candidate).",
            hint="Set [tag] registry in pipeline.toml, PIPELINE_REGISTRY, or pass --registry.",
        )
    if inputs.lock is not None:
        _verify_lock(ctx, inputs)
    res = tag_verified(
        ctx.engine(),
        image=inputs.image,
        verdict_path=inputs.verdict,
        lock=inputs.lock,
        recipe_path=inputs.recipe,
        settings=settings,
        registry=registry,
        repository=inputs.repository,
        log=ctx.log,
        env=ctx.env,
        allow_older=inputs.allow_older,
        build_attestations=inputs.build_attestations,
    )
    if inputs.release is not None and inputs.lock is not None:
        Lock.load(inputs.lock).save(inputs.release / f"{inputs.model}.toml")
        atomic_write_json(
            released_state_path(inputs.release, inputs.model),
            {
                "inputs_digest": inputs.inputs_digest,
                "ref": res.immutable_ref,
                "digest": res.digest,
                "moved": res.moved,
                "run": str(ctx.work_dir),
            },
        )
    return Outputs(
        ref=res.immutable_ref,
        digest=res.digest,
        pinned_ref=res.pinned_ref,
        moved=tuple(res.moved),
        record=res.record_path,
        pushed=res.pushed,
        attested=res.attested,
    )
