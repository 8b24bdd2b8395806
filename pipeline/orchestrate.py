"""`pipeline build --model M`: every stage of the table, in order, in one run directory.

Nothing here knows what a stage does. For each stage in `pipeline.stages.TABLE`
the loop asks the stage for its Inputs (`plan`, from the spec and the Outputs
before it), computes the inputs digest (Inputs plus the content the stage
reads), and skips the stage when the run directory records an `ok` with the
same digest; otherwise it calls `run` and records the result. A stage error
ends the run as `failed`, or as `stopped` when the stage lists it in `STOPS`.

The raw request (`BuildRequest`, from flags) is resolved once into a frozen
`BuildSpec` that is printed at start and saved as run.json.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pipeline.errors import PipelineError, UsageError
from pipeline.runs import RunDir, StageState, Status
from pipeline.stages import TABLE, Table
from pipeline.stages.base import Context, StageData, Upstream, inputs_digest
from pipeline.stages.spec import BuildSpec

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.log import Logger, StageRecord

T = TypeVar("T", bound=StageData)


@dataclass(frozen=True)
class BuildRequest:
    """What the user asked for, as given (None = not given)."""

    model: str
    atom_ref: str | None = None
    aiter_ref: str | None = None
    base_image: str | None = None
    lock: Path | None = None
    from_stage: str | None = None
    until: str | None = None
    resume: Path | None = None
    registry: str | None = None
    offline: bool = False
    auto_aiter: bool = False  # pin aiter to the newest commit compatible with ATOM (`pin --auto`)


def stage_range(order: tuple[str, ...], first: str | None, last: str | None) -> tuple[str, ...]:
    for name in (first, last):
        if name is not None and name not in order:
            raise UsageError(f"unknown stage {name!r}; the stages are {', '.join(order)}.")
    i = order.index(first) if first else 0
    j = order.index(last) if last else len(order) - 1
    if i > j:
        raise UsageError(f"--from {first} comes after --until {last}; the stages run {' → '.join(order)}.")
    return order[i : j + 1]


def resolve_spec(req: BuildRequest, settings: Settings, order: tuple[str, ...]) -> BuildSpec:
    """Validate what was asked, once, before anything runs, and freeze it."""
    from pipeline import validate
    from pipeline.lock import Lock
    from pipeline.recipes.recipe import find_recipe, load_recipe

    validate.model(req.model)
    stages = stage_range(order, req.from_stage, req.until)
    recipe = find_recipe(req.model, Path(settings.paths.recipes_dir))
    load_recipe(recipe)  # an invalid recipe stops the run before anything is pinned
    validate.check_tag_templates(settings)  # a bad tag template fails now, not after build and smoke
    if req.base_image is not None:
        validate.image_reference(req.base_image, what="--base-image")
    atom_repo = validate.url(settings.sources.atom_repo, what="ATOM repository")
    aiter_repo = validate.url(settings.sources.aiter_repo, what="aiter repository")
    atom_ref = validate.ref(req.atom_ref or settings.sources.atom_ref, what="ATOM ref")
    aiter_ref = validate.ref(req.aiter_ref or settings.sources.aiter_ref, what="aiter ref")
    if req.lock is not None:  # the lock's sources, not the configured ones
        lock = Lock.load(req.lock)
        if lock.model != req.model:
            raise UsageError(f"the lock {req.lock} is for model {lock.model!r}, not {req.model!r}.")
        atom_repo, atom_ref = lock.atom.url, lock.atom.sha
        aiter_repo, aiter_ref = lock.aiter.url, lock.aiter.sha
    return BuildSpec(
        model=req.model,
        recipe_path=recipe,
        atom_repo=atom_repo,
        aiter_repo=aiter_repo,
        atom_ref=atom_ref,
        aiter_ref=aiter_ref,
        base_image=req.base_image,
        lock_path=req.lock,
        stages=stages,
        registry=req.registry or settings.tag.registry,
        repository=settings.image.repository,
        offline=req.offline,
        auto_aiter=req.auto_aiter,
    )


def config_line(settings: Settings) -> str:
    """The spec header's first line: which configuration file this run read."""
    return f"config     {settings.config_file or 'no pipeline.toml (defaults, environment, flags)'}"


@dataclass
class RunResult:
    run_dir: Path
    states: list[StageState]
    error: PipelineError | None = None  # the stage error that ended the run early, if any
    outputs: dict[str, StageData] = field(default_factory=dict)

    def output(self, stage: str, kind: type[T]) -> T | None:
        """The typed Outputs of `stage` in this run (done now or earlier), None if it has none."""
        out = self.outputs.get(stage)
        return out if isinstance(out, kind) else None


def execute(
    req: BuildRequest, settings: Settings, log: Logger, env: Mapping[str, str], *, table: Table = TABLE
) -> RunResult:
    order = table.order()
    if req.resume:
        rd = RunDir.existing(req.resume)
        spec = rd.read_spec()
        if req.from_stage or req.until:
            spec = spec.model_copy(update={"stages": stage_range(order, req.from_stage, req.until)})
    else:
        spec = resolve_spec(req, settings, order)
        rd = RunDir.new(Path(settings.paths.runs_dir), spec.model)
        rd.write_spec(spec)
    rd.acquire()
    try:
        log.attach(rd.path)
        log.info(f"run {rd.path}")
        for line in [
            config_line(settings),
            *spec.summary_lines(settings.image.base_image, settings.smoke.docker_host),
        ]:
            log.info(f"  {line}")
        ctx = Context(
            settings=settings,
            log=log,
            env=env,
            work_dir=rd.path,
            resume_command=f"pipeline build --resume {rd.path}",
        )
        try:
            return drive(ctx, spec, rd, table)
        finally:
            ctx.close()
    finally:
        rd.release()


def drive(ctx: Context, spec: BuildSpec, rd: RunDir, table: Table) -> RunResult:
    """The skip/resume/stop loop over the table's stages."""
    result = RunResult(rd.path, [])
    up = Upstream()
    for name in table.order():
        prev = rd.state(name)
        if name not in spec.stages:
            # Outputs of stages outside the range come from earlier records of this run.
            if prev is not None and prev.status == "ok":
                up.set(name, table[name].load().Outputs.model_validate(prev.outputs))
                result.outputs[name] = up.get(name, StageData)
            continue
        stage = table[name].load()
        with ctx.log.stage(name) as rec:
            start = time.monotonic()
            try:
                inputs = stage.plan(ctx, spec, up)
                digest = inputs_digest(name, inputs, stage.reads(ctx, inputs))
            except PipelineError as e:
                return _ended(result, rd, rec, StageState(name, "failed", "", {}, 0.0, str(e)), e)
            if prev is not None and prev.status == "ok" and prev.inputs_digest == digest:
                outputs = stage.Outputs.model_validate(prev.outputs)
                rec.status = "skipped"
                rec.figure = f"done earlier: {outputs.figure()}"
                up.set(name, outputs)
                result.outputs[name] = outputs
                result.states.append(prev)
                continue
            try:
                outputs = stage.run(ctx, inputs)
            except PipelineError as e:
                status: Status = "stopped" if isinstance(e, stage.STOPS) else "failed"
                st = StageState(name, status, digest, {}, time.monotonic() - start, str(e))
                return _ended(result, rd, rec, st, e)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stopped, and the record says so
                rec.figure = "interrupted"
                rd.record(StageState(name, "stopped", digest, {}, time.monotonic() - start, "interrupted"))
                raise
            st = StageState(
                name,
                "ok",
                digest,
                outputs.model_dump(mode="json"),
                time.monotonic() - start,
                "",
                outputs.figure(),
            )
            rd.record(st)
            up.set(name, outputs)
            result.outputs[name] = outputs
            result.states.append(st)
            rec.figure = outputs.figure()
    return result


def _ended(
    result: RunResult, rd: RunDir, rec: StageRecord, st: StageState, error: PipelineError
) -> RunResult:
    rd.record(st)
    result.states.append(st)
    result.error = error
    rec.status = st.status
    rec.figure = error.message.splitlines()[0]
    return result
