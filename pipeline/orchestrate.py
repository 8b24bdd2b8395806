"""`pipeline build --model M`: pin → check → patch → render → build → smoke → tag.

Each stage is a function `(run: Run) -> outputs` registered in STAGES with a
function giving its inputs; the run directory records each stage's status and
inputs digest, so `--resume` skips what already succeeded for the same inputs
and starts at the stage that failed.

The raw request (`BuildRequest`, from flags) is resolved once into a frozen
`BuildSpec` that is printed at start and saved as run.json.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline import __version__
from pipeline.config import Settings
from pipeline.errors import (
    IncompatibleError,
    NoHardware,
    PipelineError,
    UsageError,
)
from pipeline.fsutil import atomic_write_json, atomic_write_text, sha256_file
from pipeline.gitw import GitRepo
from pipeline.lock import Lock, PatchPin, default_lock_path
from pipeline.log import Logger
from pipeline.runs import STAGE_ORDER, RunDir, StageState, inputs_digest


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
    docker_host: str | None = None
    registry: str | None = None
    offline: bool = False
    auto_aiter: bool = False  # pin aiter to the newest commit compatible with ATOM (`pin --auto`)


@dataclass(frozen=True)
class BuildSpec:
    """The resolved, frozen description of this run; every stage reads it."""

    model: str
    recipe_path: str
    recipe_sha256: str
    atom_repo: str
    aiter_repo: str
    atom_ref: str
    aiter_ref: str
    base_image: str
    lock_path: str | None
    stages: tuple[str, ...]
    docker_host: str
    registry: str
    repository: str
    offline: bool
    auto_aiter: bool = False
    tool_version: str = __version__

    def summary_lines(self) -> list[str]:
        return [
            f"model      {self.model}  (recipe {self.recipe_path}, sha256 {self.recipe_sha256[:12]})",
            f"ATOM       {self.atom_repo} @ {self.atom_ref}",
            f"aiter      {self.aiter_repo} @ {self.aiter_ref}"
            + (" (newest compatible with ATOM: pin --auto)" if self.auto_aiter else ""),
            f"base image {self.base_image}",
            f"stages     {' → '.join(self.stages)}",
            f"engine     {self.docker_host or 'local (DOCKER_HOST or /var/run/docker.sock)'}",
            f"registry   {self.registry or '(none: tag stage pushes nowhere)'}  repository {self.repository}",
        ]


def resolve_spec(req: BuildRequest, settings: Settings) -> BuildSpec:
    from pipeline.recipe import find_recipe, load_recipe

    recipe = find_recipe(req.model, Path(settings.paths.recipes_dir))
    load_recipe(recipe)  # an invalid recipe stops the run before anything is pinned
    for name in (req.from_stage, req.until):
        if name is not None and name not in STAGE_ORDER:
            raise UsageError(f"unknown stage {name!r}; stages are {', '.join(STAGE_ORDER)}.")
    first = STAGE_ORDER.index(req.from_stage) if req.from_stage else 0
    last = STAGE_ORDER.index(req.until) if req.until else len(STAGE_ORDER) - 1
    if first > last:
        raise UsageError(f"--from {req.from_stage} comes after --until {req.until}.")
    return BuildSpec(
        model=req.model,
        recipe_path=str(recipe),
        recipe_sha256=sha256_file(recipe),
        atom_repo=settings.sources.atom_repo,
        aiter_repo=settings.sources.aiter_repo,
        atom_ref=req.atom_ref or settings.sources.atom_ref,
        aiter_ref=req.aiter_ref or settings.sources.aiter_ref,
        base_image=req.base_image or settings.image.base_image,
        lock_path=str(req.lock) if req.lock else None,
        stages=STAGE_ORDER[first : last + 1],
        docker_host=req.docker_host or settings.smoke.docker_host,
        registry=req.registry or settings.tag.registry,
        repository=settings.image.repository,
        offline=req.offline,
        auto_aiter=req.auto_aiter,
    )


@dataclass
class Run:
    """What a stage function gets: the spec, settings, log, run dir, earlier outputs."""

    spec: BuildSpec
    settings: Settings
    log: Logger
    dir: RunDir
    env: Mapping[str, str]
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    _engine: Any = None

    @property
    def lock_file(self) -> Path:
        return self.dir.path / "lock.toml"

    def lock(self) -> Lock:
        return Lock.load(self.lock_file)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def engine(self) -> Any:
        if self._engine is None:
            from pipeline.dockerw import Engine

            self._engine = Engine.connect(self.spec.docker_host or None)
        return self._engine


StageFn = Callable[[Run], dict[str, Any]]
InputsFn = Callable[[Run], Any]


class StopRun(Exception):
    """A stage ended the run early without failing (e.g. no GPUs: image kept as candidate)."""

    def __init__(self, error: PipelineError, outputs: dict[str, Any]) -> None:
        super().__init__(str(error))
        self.error = error
        self.outputs = outputs


# -- the stages ------------------------------------------------------------------


def _pin_inputs(run: Run) -> Any:
    s = run.spec
    return [s.atom_repo, s.atom_ref, s.aiter_repo, s.aiter_ref, s.base_image, s.lock_path, s.auto_aiter]


def stage_pin(run: Run) -> dict[str, Any]:
    auto: dict[str, Any] = {}
    if run.spec.lock_path:
        lock = Lock.load(Path(run.spec.lock_path))
        run.log.detail(f"using the given lock file {run.spec.lock_path}")
    else:
        from pipeline.sources import auto_aiter_chooser, pin

        released = default_lock_path(Path(run.settings.paths.locks_dir), run.spec.model)
        chooser = (
            auto_aiter_chooser(
                run.settings.cache_dir,
                run.log,
                auto,
                Path(run.settings.paths.patches_dir),
                Path(run.spec.recipe_path),
            )
            if run.spec.auto_aiter
            else None
        )
        lock = pin(
            run.settings,
            model=run.spec.model,
            atom_ref=run.spec.atom_ref,
            aiter_ref=run.spec.aiter_ref,
            base_image=run.spec.base_image,
            log=run.log,
            offline=run.spec.offline,
            previous=Lock.load(released) if released.is_file() else None,
            choose_aiter=chooser,
        ).lock
    lock.save(run.lock_file)
    return {
        "atom": lock.atom.sha,
        "aiter": lock.aiter.sha,
        "lock_sha256": lock.digest(),
        "auto": auto,
        "figure": f"ATOM {lock.atom.sha[:9]} · aiter {lock.aiter.sha[:10]}",
    }


def _mirrors(run: Run) -> tuple[GitRepo, GitRepo]:
    from pipeline.sources import mirrors_for_lock

    return mirrors_for_lock(run.settings, run.lock())


def _patches_digest(run: Run) -> list[tuple[str, str]]:
    pdir = Path(run.settings.paths.patches_dir)
    files = sorted(pdir.glob("*")) if pdir.is_dir() else []
    return [(f.name, sha256_file(f)) for f in files if f.is_file()]


def stage_check(run: Run) -> dict[str, Any]:
    """Check the tree we would build (the pin plus the patch series) against the pinned aiter.

    The pristine pin is checked too, for the record: what the series fixes and what it leaves.
    """
    from pipeline.compat import run_check
    from pipeline.compat.reach import gate_model
    from pipeline.patchq import PatchSeries, patched_commit
    from pipeline.recipe import load_recipe

    atom, aiter = _mirrors(run)
    lock = run.lock()
    cache = run.settings.cache_dir / "compat"
    pristine = run_check(atom, lock.atom.sha, aiter, lock.aiter.sha, cache_dir=cache)
    atomic_write_json(run.dir.path / "check-pristine.json", pristine.to_json())
    before = sum(1 for f in pristine.findings if f.severity == "error")
    # The patched commit lives in the mirror's object store (no work tree); the patch
    # stage records exactly this series result, so it is computed once, here.
    series = PatchSeries.load(Path(run.settings.paths.patches_dir))
    applied = patched_commit(series, atom, lock.atom.sha, aiter, lock.aiter.sha)
    head = applied.head_sha
    report = (
        pristine
        if head == lock.atom.sha
        else run_check(atom, head, aiter, lock.aiter.sha, cache_dir=cache, dated_by=lock.atom.sha)
    )
    # Gate for this model: findings off its code path warn (with the evidence), then waivers.
    gate = gate_model(report, atom, load_recipe(Path(run.spec.recipe_path)), cache_dir=cache)
    report, waived = gate.report, gate.waived
    for msg in (*gate.warnings, *(n.message for n in gate.notes)):
        run.log.warn(msg)
    off_path = gate.off_path
    atomic_write_json(run.dir.path / "check.json", report.to_json())
    atomic_write_json(run.dir.path / "check.sarif", report.to_sarif())
    atomic_write_text(run.dir.path / "check.txt", report.to_text())
    after = sum(1 for f in report.findings if f.severity == "error")
    if after:
        raise IncompatibleError(
            f"ATOM {lock.atom.sha[:9]} (with the patch series) calls aiter {lock.aiter.sha[:10]} "
            f"with the wrong signature; nothing was built.\n{report.to_text()}",
            hint="Add or fix a patch under patches/atom (`pipeline patch new`), or pin an aiter "
            f"that this ATOM supports (`pipeline pin --model {run.spec.model} --auto`).",
        )
    fixed = f"{before - waived - off_path} fixed by patches, " if before > waived + off_path else ""
    fixed += f"{off_path} off the model's path, " if off_path else ""
    fixed += f"{waived} waived by the recipe, " if waived else ""
    return {
        "head": head,
        "pins": [p.model_dump() for p in applied.pins],
        "notes": applied.notes,
        "pristine_errors": before,
        "reach": gate.reach.to_json() if gate.reach else None,
        "off_path": off_path,
        "checked": report.calls_checked,
        "unchecked": report.calls_unchecked,
        "figure": f"{report.calls_checked} calls bind ({fixed}{report.calls_unchecked} unchecked)",
    }


def stage_patch(run: Run) -> dict[str, Any]:
    """Record the series in the lock and pin the patched commit in the mirror."""
    from pipeline.sources import keep_pinned

    checked = run.outputs["check"]
    atom, _ = _mirrors(run)
    lock = run.lock()
    if checked["head"] != lock.atom.sha:
        keep_pinned(atom, checked["head"])  # a ref, so no gc drops it before render
    for note in checked["notes"]:
        run.log.info(f"  {note}")
    lock = lock.with_patches(tuple(PatchPin.model_validate(p) for p in checked["pins"]))
    lock.save(run.lock_file)
    names = [p.name for p in lock.applied_patches]
    return {
        "head": checked["head"],
        "applied": names,
        "notes": checked["notes"],
        "lock_sha256": lock.digest(),
        "figure": f"{len(names)} applied" + (f": {', '.join(names)}" if names else ""),
    }


def stage_render(run: Run) -> dict[str, Any]:
    from pipeline.render import render_context
    from pipeline.sources import submodule_mirror

    atom, aiter = _mirrors(run)
    lock = run.lock()
    subs = {s.path: submodule_mirror(run.settings, s.url) for s in lock.aiter.submodules}
    ctx = render_context(
        lock=lock,
        atom=atom,
        atom_tree_sha=run.outputs["patch"]["head"],
        aiter=aiter,
        submodule_repos=subs,
        recipe_path=Path(run.spec.recipe_path),
        settings=run.settings,
        out_dir=run.dir.path / "context",
        templates_dir=Path(run.settings.paths.templates_dir),
    )
    return {
        "context": str(ctx.dir),
        "inputs_digest": ctx.inputs_digest,
        "figure": f"inputs {ctx.inputs_digest[:12]}",
    }


def stage_build(run: Run) -> dict[str, Any]:
    from pipeline.imagebuild import build_image, registry_lookup

    out = build_image(
        run.engine(),
        Path(run.outputs["render"]["context"]),
        tag=None,
        log=run.log,
        run_dir=run.dir.path,
        remote_lookup=registry_lookup(run.settings, run.env, run.log),
    )
    return {
        "image": out.image_id,
        "candidate": out.image_ref,
        "skipped": out.skipped,
        "figure": ("reused " if out.skipped else "built ") + out.image_id[:19],
    }


def stage_smoke(run: Run) -> dict[str, Any]:
    from pipeline.recipe import load_recipe
    from pipeline.smoke import run_smoke

    image = run.outputs["build"]["image"]
    recipe = load_recipe(Path(run.spec.recipe_path))
    try:
        verdict = run_smoke(
            run.engine(),
            image=image,
            recipe=recipe,
            recipe_path=Path(run.spec.recipe_path),
            settings=run.settings,
            env=run.env,
            run_dir=run.dir.path / "smoke",
            log=run.log,
            run_all=run.settings.smoke.run_all_checks,
        )
    except NoHardware as e:
        ref = run.outputs["build"].get("candidate") or image
        e.hint = (
            f"The image is kept as an untagged candidate ({ref}). Smoke it on an MI355 host: "
            f"pipeline smoke --image {ref} --model {run.spec.model} --docker-host ssh://USER@GPU-HOST, "
            f"then `pipeline build --resume {run.dir.path}`."
        )
        raise StopRun(e, {"image": image}) from e
    from pipeline.errors import SmokeFailed

    if not verdict.passed:
        raise SmokeFailed(f"smoke test failed: {verdict.reason}", hint=f"Verdict: {run.dir.path / 'smoke'}.")
    return {"verdict": str(run.dir.path / "smoke" / "verdict.json"), "figure": "all gates passed"}


def stage_tag(run: Run) -> dict[str, Any]:
    from pipeline.tag import tag_verified

    if not run.spec.registry:
        raise UsageError(
            "no registry configured for the tag stage.",
            hint="Set [tag] registry in pipeline.toml, PIPELINE_REGISTRY, or --registry.",
        )
    res = tag_verified(
        run.engine(),
        image=run.outputs["build"]["image"],
        verdict_path=Path(run.outputs["smoke"]["verdict"]),
        lock=run.lock_file,
        recipe_path=Path(run.spec.recipe_path),
        settings=run.settings,
        registry=run.spec.registry,
        log=run.log,
        env=run.env,
    )
    # The model's released state: the lock it was built from, and what it was released as
    # (`pipeline rebuild` compares the next inputs digest with it).
    locks_dir = Path(run.settings.paths.locks_dir)
    run.lock().save(default_lock_path(locks_dir, run.spec.model))
    atomic_write_json(
        released_state_path(locks_dir, run.spec.model),
        {
            "inputs_digest": run.outputs["render"]["inputs_digest"],
            "ref": res.immutable_ref,
            "digest": res.digest,
            "moved": res.moved,
            "run": str(run.dir.path),
        },
    )
    return {"ref": res.immutable_ref, "digest": res.digest, "moved": res.moved, "figure": res.immutable_ref}


def released_state_path(locks_dir: Path, model: str) -> Path:
    return locks_dir / f"{model}.released.json"


STAGES: dict[str, tuple[StageFn, InputsFn]] = {
    "pin": (stage_pin, _pin_inputs),
    "check": (stage_check, lambda r: [r.outputs.get("pin"), _patches_digest(r), r.spec.recipe_sha256]),
    "patch": (stage_patch, lambda r: r.outputs.get("check")),
    "render": (
        stage_render,
        lambda r: [r.outputs.get("patch"), r.spec.recipe_sha256, r.settings.image.model_dump()],
    ),
    "build": (stage_build, lambda r: [r.outputs.get("render"), r.spec.docker_host]),
    "smoke": (stage_smoke, lambda r: [r.outputs.get("build"), r.spec.recipe_sha256]),
    "tag": (stage_tag, lambda r: [r.outputs.get("smoke"), r.spec.registry, r.settings.tag.model_dump()]),
}


@dataclass
class RunResult:
    run_dir: Path
    states: list[StageState]
    error: PipelineError | None = None  # the stage error that ended the run early, if any

    def outputs(self, stage: str) -> dict[str, Any]:
        for st in self.states:
            if st.name == stage and st.status == "ok":
                return st.outputs
        return {}


def execute(req: BuildRequest, settings: Settings, log: Logger, env: Mapping[str, str]) -> RunResult:
    if req.resume:
        rd = RunDir.existing(req.resume)
        saved = rd.read_spec()
        spec = BuildSpec(**{**saved, "stages": tuple(saved["stages"])})
        if req.from_stage or req.until:
            spec = _restrict(spec, req)
    else:
        spec = resolve_spec(req, settings)
        rd = RunDir.new(Path(settings.paths.runs_dir), spec.model)
        rd.write_spec(asdict(spec))
    rd.acquire()
    try:
        log.attach(rd.path)
        log.info(f"run {rd.path}")
        for line in spec.summary_lines():
            log.info(f"  {line}")
        run = Run(spec=spec, settings=settings, log=log, dir=rd, env=env)
        try:
            return _drive(run)
        finally:
            run.close()
    finally:
        rd.release()


def _restrict(spec: BuildSpec, req: BuildRequest) -> BuildSpec:
    first = STAGE_ORDER.index(req.from_stage) if req.from_stage else 0
    last = STAGE_ORDER.index(req.until) if req.until else len(STAGE_ORDER) - 1
    return BuildSpec(**{**asdict(spec), "stages": STAGE_ORDER[first : last + 1]})


def _drive(run: Run) -> RunResult:
    states: list[StageState] = []
    # Outputs of stages before the requested range come from earlier records.
    for name in STAGE_ORDER:
        prev = run.dir.state(name)
        if prev is not None and prev.status == "ok":
            run.outputs[name] = prev.outputs
    for name in run.spec.stages:
        fn, inputs_fn = STAGES[name]
        digest = inputs_digest(inputs_fn(run))
        prev = run.dir.state(name)
        with run.log.stage(name) as rec:
            if prev is not None and prev.status == "ok" and prev.inputs_digest == digest:
                rec.status = "skipped"
                rec.figure = "done earlier: " + str(prev.outputs.get("figure", ""))
                run.outputs[name] = prev.outputs
                states.append(prev)
                continue
            start = time.monotonic()
            try:
                outputs = fn(run)
            except StopRun as stop:
                st = StageState(
                    name, "stopped", digest, stop.outputs, time.monotonic() - start, str(stop.error)
                )
                run.dir.record(st)
                states.append(st)
                rec.status = "stopped"
                rec.figure = stop.error.message
                return RunResult(run.dir.path, states, stop.error)
            except PipelineError as e:
                st = StageState(name, "failed", digest, {}, time.monotonic() - start, str(e))
                run.dir.record(st)
                states.append(st)
                rec.status = "failed"
                rec.figure = e.message.splitlines()[0]
                return RunResult(run.dir.path, states, e)
            st = StageState(name, "ok", digest, outputs, time.monotonic() - start)
            run.dir.record(st)
            run.outputs[name] = outputs
            states.append(st)
            rec.figure = str(outputs.get("figure", ""))
    return RunResult(run.dir.path, states)
