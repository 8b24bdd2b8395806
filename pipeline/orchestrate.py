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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pipeline.errors import PipelineError, UsageError
from pipeline.runs import RunDir, StageState, Status
from pipeline.stages import TABLE, Table
from pipeline.stages.base import (
    Context,
    InputsRecord,
    StageData,
    Upstream,
    inputs_record,
    local,
    portable,
)
from pipeline.stages.spec import HOST_LOCAL, BuildSpec

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
    repin: bool = False  # --resume: pin again (the run's pin is otherwise kept)


def stage_range(order: tuple[str, ...], first: str | None, last: str | None) -> tuple[str, ...]:
    for name in (first, last):
        if name is not None and name not in order:
            raise UsageError(f"unknown stage {name!r}; the stages are {', '.join(order)}.")
    i = order.index(first) if first else 0
    j = order.index(last) if last else len(order) - 1
    if i > j:
        raise UsageError(f"--from {first} comes after --until {last}; the stages run {' → '.join(order)}.")
    return order[i : j + 1]


def resolve_spec(
    req: BuildRequest, settings: Settings, order: tuple[str, ...], env: Mapping[str, str] | None = None
) -> BuildSpec:
    """Validate what was asked, once, before anything runs, and freeze it."""
    from pipeline import validate
    from pipeline.lock import Lock
    from pipeline.recipes.recipe import find_recipe, load_recipe

    validate.model(req.model)
    stages = stage_range(order, req.from_stage, req.until)
    recipe = find_recipe(req.model, Path(settings.paths.recipes_dir))
    load_recipe(recipe, allowed_secrets=settings.recipe_secrets)  # an invalid recipe stops the run first
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
    from pipeline.stages.render import source_date_epoch

    return BuildSpec(
        settings=frozen_settings(settings),
        source_date_epoch=source_date_epoch(env or {}),
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


PREVIOUS_LOCK = "previous-lock.toml"


def frozen_settings(settings: Settings) -> dict[str, dict[str, Any]]:
    """The settings a run keeps (run.json): every section, without the host-local keys."""
    from pipeline.config import SECTIONS

    return {
        section: {
            k: v for k, v in getattr(settings, section).model_dump(mode="json").items() if k not in HOST_LOCAL
        }
        for section in SECTIONS
    }


def refuse_contradictions(req: BuildRequest, settings: Settings, spec: BuildSpec) -> None:
    """A flag given with --resume that contradicts the run's state: exit 2, naming both values."""
    found = []
    for flag, given, kept in (
        ("--model", req.model or None, spec.model),
        ("--atom", req.atom_ref, spec.atom_ref),
        ("--aiter", req.aiter_ref, spec.aiter_ref),
        ("--base-image", req.base_image, spec.base_image),
        ("--lock", str(req.lock) if req.lock else None, str(spec.lock_path) if spec.lock_path else None),
    ):
        if given is not None and given != kept:
            found.append(f"{flag} {given!r} (the run has {kept!r})")
    for flag, on, was in (
        ("--offline", req.offline, spec.offline),
        ("--auto", req.auto_aiter, spec.auto_aiter),
    ):
        if on and not was:
            found.append(f"{flag} (the run was started without it)")
    if spec.settings:
        for section, values in spec.settings.items():
            current = getattr(settings, section).model_dump(mode="json")
            for key, kept in values.items():
                if settings.origins.get(key) == "flag" and current.get(key) != kept:
                    found.append(f"[{section}] {key} = {current.get(key)!r} (the run has {kept!r})")
    if found:
        raise UsageError(
            f"--resume: this {spec.model} run decided otherwise at its start: "
            + "; ".join(found)
            + ". Nothing was run.",
            hint="Drop the flag to finish the run as it was started, or start a new run with it "
            f"(`pipeline build --model {spec.model} ...`). Host-local settings may differ on resume: "
            + ", ".join(HOST_LOCAL)
            + ".",
        )


def resumed(
    spec: BuildSpec, settings: Settings, env: Mapping[str, str], log: Logger
) -> tuple[Settings, Mapping[str, str]]:
    """The settings and environment a resumed run runs with: the run's own, host-local keys from here.

    A setting the configuration now gives otherwise is named (the run keeps its value).
    """
    if not spec.settings:  # a run.json from before settings were frozen
        return settings, env
    sections: dict[str, Any] = {}
    for section, kept in spec.settings.items():
        current = getattr(settings, section).model_dump(mode="json")
        for key, value in kept.items():
            if current.get(key) != value:
                where = settings.origins.get(key, "the configuration")
                log.warn(
                    f"[{section}] {key} is now {current.get(key)!r} ({where}); this run keeps {value!r} "
                    "from its start (start a new run to use the new value)."
                )
        sections[section] = {**current, **kept}
    frozen = settings.model_validate({**sections, "origins": settings.origins})
    env = dict(env)
    env.pop("SOURCE_DATE_EPOCH", None)
    if spec.source_date_epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(spec.source_date_epoch)
    return frozen, env


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
        refuse_contradictions(req, settings, spec)
        settings, env = resumed(spec, settings, env, log)
        # a resume finishes the run (every stage) unless told where to start or stop: a run started
        # `--until build` on a build host is finished on a GPU host with `--resume` alone
        spec = spec.model_copy(update={"stages": stage_range(order, req.from_stage, req.until)})
    else:
        if req.repin:
            raise UsageError("--repin re-pins a run: it goes with --resume DIR.")
        spec = resolve_spec(req, settings, order, env)
        rd = RunDir.new(Path(settings.paths.runs_dir), spec.model)
        previous = Path(settings.paths.locks_dir) / f"{spec.model}.toml"
        if previous.is_file():  # pin keeps its digest and patches; tag rewrites the file later
            import shutil

            shutil.copyfile(previous, rd.path / PREVIOUS_LOCK)
            spec = spec.model_copy(update={"previous_lock": PREVIOUS_LOCK})
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
            return drive(ctx, spec, rd, table, repin=req.repin)
        finally:
            ctx.close()
    finally:
        rd.release()


# Stages whose `ok` record is a decision of the run: kept on --resume even when their inputs
# changed (said, with what changed), re-made only with --repin.
FROZEN = frozenset({"pin"})


@dataclass(frozen=True)
class Decision:
    """Whether a stage of an existing run runs, and why (said on the console and by `--print`)."""

    run: bool
    why: str
    kept: bool = False  # a FROZEN stage whose inputs moved: the run keeps its decision


def decide(name: str, prev: StageState | None, seen: InputsRecord, *, repin: bool = False) -> Decision:
    """The one skip/run rule of a resumed run: `drive` acts on it, `build --print` shows it."""
    if prev is None:
        return Decision(True, "no record")
    if prev.status != "ok":
        return Decision(True, f"it {prev.status} earlier")
    if repin and name in FROZEN:
        return Decision(True, "--repin")
    if prev.inputs_digest == seen.digest:
        return Decision(False, "done earlier for the same inputs")
    changes = "; ".join(seen.changes(prev.inputs, prev.reads))
    if name in FROZEN:
        return Decision(False, changes or "its inputs changed", kept=True)
    return Decision(True, changes or "its inputs digest changed (the record predates the inputs it keeps)")


def drive(ctx: Context, spec: BuildSpec, rd: RunDir, table: Table, *, repin: bool = False) -> RunResult:
    """The skip/resume/stop loop over the table's stages."""
    result = RunResult(rd.path, [])
    up = Upstream()
    for name in table.order():
        prev = rd.state(name)
        if name not in spec.stages:
            if prev is not None and prev.status != "ok" and prev.earlier:
                prev = _restored(ctx, spec, up, rd, table[name].load(), prev)
            # Outputs of stages outside the range come from earlier records of this run.
            if prev is not None and prev.status == "ok":
                up.set(name, table[name].load().Outputs.model_validate(local(prev.outputs, rd.path)))
                result.outputs[name] = up.get(name, StageData)
            continue
        stage = table[name].load()
        with ctx.log.stage(name) as rec:
            start = time.monotonic()
            try:
                inputs = stage.plan(ctx, spec, up)
                seen = inputs_record(name, inputs, stage.reads(ctx, inputs), rd.path)
            except PipelineError as e:
                return _ended(result, rd, rec, StageState(name, "failed", "", {}, 0.0, str(e)), e)
            digest = seen.digest
            if prev is not None and prev.status != "ok" and prev.earlier:
                prev = _restored(ctx, spec, up, rd, stage, prev, digest)
            done = prev is not None and prev.status == "ok"
            choice = decide(name, prev, seen, repin=repin)
            if not choice.run and prev is not None:
                outputs = stage.Outputs.model_validate(local(prev.outputs, rd.path))
                rec.status = "skipped"
                rec.figure = f"done earlier: {outputs.figure()}"
                if choice.kept:  # a run's decision is not re-made behind its back
                    ctx.log.warn(
                        f"{name}: {choice.why} since this run did it; "
                        f"the run keeps {outputs.figure()}. Pass --repin to {name} again."
                    )
                up.set(name, outputs)
                result.outputs[name] = outputs
                result.states.append(prev)
                continue
            if prev is not None:  # it ran before in this run: say why it runs again
                ctx.log.info(f"{name} runs again: {choice.why}")
            try:
                outputs = stage.run(ctx, inputs)
            except PipelineError as e:
                status: Status = "stopped" if isinstance(e, stage.STOPS) else "failed"
                st = StageState(name, status, digest, {}, time.monotonic() - start, str(e))
                st.inputs, st.reads = seen.inputs, seen.reads
                if prev is not None:  # kept, for inputs that come back as they were
                    st.earlier = {**asdict(prev), "earlier": {}} if done else prev.earlier
                return _ended(result, rd, rec, st, e)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stopped, and the record says so
                rec.figure = "interrupted"
                rd.record(StageState(name, "stopped", digest, {}, time.monotonic() - start, "interrupted"))
                raise
            if prev is not None and prev.status == "ok" and name in FROZEN:
                before = stage.Outputs.model_validate(local(prev.outputs, rd.path)).figure()
                ctx.log.info(f"{name} again (--repin): {before} → {outputs.figure()}")
            st = StageState(
                name,
                "ok",
                digest,
                portable(outputs.model_dump(mode="json"), rd.path),
                time.monotonic() - start,
                "",
                outputs.figure(),
                seen.inputs,
                seen.reads,
            )
            rd.record(st)
            up.set(name, outputs)
            result.outputs[name] = outputs
            result.states.append(st)
            rec.figure = outputs.figure()
    return result


def _restored(
    ctx: Context, spec: BuildSpec, up: Upstream, rd: RunDir, stage: Any, prev: StageState, digest: str = ""
) -> StageState:
    """The `ok` record a failed re-run kept, when the inputs are back to its digest (what made it
    fail was undone: done earlier); else `prev`. `digest`: the inputs digest, planned here if not given."""
    before = StageState(**prev.earlier)
    if not digest:
        try:
            inputs = stage.plan(ctx, spec, up)
            digest = inputs_record(prev.name, inputs, stage.reads(ctx, inputs), rd.path).digest
        except PipelineError:
            return prev
    if before.inputs_digest != digest:
        return prev
    rd.record(before)
    return before


def _ended(
    result: RunResult, rd: RunDir, rec: StageRecord, st: StageState, error: PipelineError
) -> RunResult:
    rd.record(st)
    result.states.append(st)
    result.error = error
    rec.status = st.status
    rec.figure = error.message.splitlines()[0]
    return result
